// Command epkv-dcp-check is a third-party DCP client built on Couchbase's Go SDK core
// (gocbcore v10, DCPAgent). It connects to one KV node over the memcached binary protocol
// only (CCCP config through GET_CLUSTER_CONFIG, no HTTP), streams each vBucket between a
// start point (0, or a resume point from a state file) and an end seqno, prints one JSON
// line per DCP event on stdout, checks the ordering guarantees DCP gives, and writes the
// resume points back to the state file.
//
// Exit code 0 when every stream ended normally (STREAM_END with reason ok, or, with
// --end max, when the streams have been idle for --idle-ms); 2 on a bootstrap failure (or
// no ready agent within --bootstrap-secs), a stream request error, a rollback, a stream
// ended for any other reason, a broken ordering guarantee or the global --timeout-secs; 64
// on bad flags or input files.
//
// Lines on stdout, one JSON object each ("vb" and "seqno" are numbers):
//
//	{"event":"snapshot","vb":..,"snap_start":..,"snap_end":..,"snap_flags":..}
//	{"event":"mutation","vb":..,"seqno":..,"rev":..,"cas":..,"key":"..","value_len":..,"flags":..,"expiry":..}
//	{"event":"deletion","vb":..,"seqno":..,"rev":..,"cas":..,"key":"..","value_len":..}
//	{"event":"expiration","vb":..,"seqno":..,"rev":..,"cas":..,"key":".."}
//	{"event":"end","vb":..,"reason":"ok"}
//	{"event":"rollback","vb":..,"seqno":..}
//	{"event":"error","vb":..,"op":"..","error":".."}    (vb absent for errors of no vBucket)
//	{"event":"violation","vb":..,"seqno":..,"detail":".."}
//	{"event":"stream_open","vb":..,"vbuuid":..,"start":..,"end":..,"snap_start":..,"snap_end":..}
//	{"event":"summary","streams":..,"ended":..,"failed":..,"events":..,"exit":..}
//
// With --collections, mutations, deletions and expirations also carry "collection_id", and
// collection/scope system events are printed as {"event":"system","type":"..",...}.
//
// What gocbcore v10.8.1 sends, in order, on its one DCP connection (see
// memdclientdialer_component.go bootstrap and dcpBootstrap): pipelined HELLO (0x1f),
// GET_ERROR_MAP v2 (0xfe), SASL_LIST_MECHS (0x20) and SASL_AUTH (0x21); for SCRAM,
// SASL_STEP (0x22); then pipelined SELECT_BUCKET (0x89) and GET_CLUSTER_CONFIG (0xb5); DCP_OPEN (0x50, flags 0x1 producer),
// then DCP_CONTROL (0x5e) enable_noop=true, set_noop_interval=180, set_priority=low,
// connection_buffer_size=<--buffer-size> (left out with --buffer-size 0) and
// send_stream_end_on_client_close_stream=true; a failed DCP_CONTROL fails the bootstrap,
// except the last. The noop interval is fixed by gocbcore (no flag can change it). Then
// this program sends DCP_GET_FAILOVER_LOG (0x54) for each vBucket started from 0 and one
// DCP_STREAM_REQ (0x53, flags 0) per vBucket; gocbcore answers DCP_NOOP (0x5c), sends
// DCP_BUFFER_ACKNOWLEDGEMENT (0x5d) every half buffer consumed and, from the CCCP poller,
// GET_CLUSTER_CONFIG every --cccp-poll-ms on the same connection.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/couchbase/gocbcore/v10"
	"github.com/couchbase/gocbcore/v10/memd"
)

const (
	exitOK    = 0
	exitFail  = 2
	exitUsage = 64
	// maxSeqno is the end seqno of a stream that never ends by itself (--end max).
	maxSeqno = uint64(math.MaxUint64)
)

// options are the command-line flags.
type options struct {
	addr          string
	user          string
	password      string
	saslMechs     string
	bucket        string
	name          string
	vbuckets      int
	collections   bool
	expiryOpcode  bool
	bufferSize    int
	statePath     string
	end           string
	endFile       string
	idleMs        int
	timeoutSecs   int
	bootstrapSecs int
	cccpPollMs    int
	verbose       bool
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.addr, "addr", "127.0.0.1:11210", "KV address HOST:PORT of the node to bootstrap from (memcached protocol only)")
	flag.StringVar(&o.user, "user", "", "SASL user (none: no SASL)")
	flag.StringVar(&o.password, "password", "", "SASL password")
	flag.StringVar(&o.saslMechs, "sasl-mechs", "SCRAM-SHA512,SCRAM-SHA256,SCRAM-SHA1",
		"SASL mechanisms to try in order (gocbcore's default on plain TCP; add PLAIN to allow it)")
	flag.StringVar(&o.bucket, "bucket", "default", "bucket to stream")
	flag.StringVar(&o.name, "name", "epkv-dcp-check", "DCP connection name (DCP_OPEN key)")
	flag.IntVar(&o.vbuckets, "vbuckets", 1024, "stream vBuckets 0..N-1 (at most the bucket's vBucket count)")
	flag.BoolVar(&o.collections, "collections", false, "HELLO collections, so that the DCP connection is collection-aware")
	flag.BoolVar(&o.expiryOpcode, "expiry-opcode", false, "DCP_CONTROL enable_expiry_opcode, so that expiries arrive as DCP_EXPIRATION")
	flag.IntVar(&o.bufferSize, "buffer-size", 1<<20,
		"flow control: DCP_CONTROL connection_buffer_size in bytes, acknowledged with DCP_BUFFER_ACKNOWLEDGEMENT every half buffer; 0 turns flow control off")
	flag.StringVar(&o.statePath, "state", "",
		"JSON file of resume points {\"vb\":{\"vbuuid\":..,\"seqno\":..,\"snap_start\":..,\"snap_end\":..}}: read if it exists, written at the end")
	flag.StringVar(&o.end, "end", "high",
		"end seqno of each stream: high (from --end-file, else GET_ALL_VB_SEQNOS), max (0xffffffffffffffff, stop after --idle-ms without events) or a number")
	flag.StringVar(&o.endFile, "end-file", "", "JSON map {\"vb\": high_seqno} giving each vBucket's end seqno for --end high; vBuckets it omits end at 0")
	flag.IntVar(&o.idleMs, "idle-ms", 2000, "with --end max: stop after this many milliseconds without a DCP event")
	flag.IntVar(&o.timeoutSecs, "timeout-secs", 60, "give up (exit 2) after this many seconds in all")
	flag.IntVar(&o.bootstrapSecs, "bootstrap-secs", 20, "give up (exit 2) when the agent is not ready (connected, authenticated, DCP opened, cluster map accepted) within this many seconds")
	flag.IntVar(&o.cccpPollMs, "cccp-poll-ms", 2500, "period of gocbcore's CCCP poller (GET_CLUSTER_CONFIG on the DCP connection)")
	flag.BoolVar(&o.verbose, "verbose", false, "gocbcore's debug log on stderr")
	flag.CommandLine.Init(os.Args[0], flag.ContinueOnError)
	if err := flag.CommandLine.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(exitOK)
		}
		os.Exit(exitUsage)
	}
	return o
}

// vbState is one vBucket's resume point, as kept in the state file.
type vbState struct {
	VbUUID    uint64 `json:"vbuuid"`
	Seqno     uint64 `json:"seqno"`
	SnapStart uint64 `json:"snap_start"`
	SnapEnd   uint64 `json:"snap_end"`
}

// event is what the stream observer and the request callbacks hand to the main loop.
type event struct {
	kind string
	vb   uint16
	line map[string]any
	// seqno of a data event or the rollback seqno; snapshot bounds of a marker.
	seqno, snapStart, snapEnd uint64
	// failover log of a successful stream request (newest first).
	failover []gocbcore.FailoverEntry
	err      error
}

// observer implements gocbcore.StreamObserver by forwarding every callback to events.
// Sends give up once stop is closed so that gocbcore's DCP goroutine never blocks in a
// callback while the agent shuts down.
type observer struct {
	events      chan<- event
	stop        <-chan struct{}
	collections bool
}

func (o *observer) send(e event) {
	select {
	case o.events <- e:
	case <-o.stop:
	}
}

func (o *observer) withCollection(line map[string]any, cid uint32) map[string]any {
	if o.collections {
		line["collection_id"] = cid
	}
	return line
}

func (o *observer) SnapshotMarker(m gocbcore.DcpSnapshotMarker) {
	line := map[string]any{"event": "snapshot", "vb": m.VbID, "snap_start": m.StartSeqNo,
		"snap_end": m.EndSeqNo, "snap_flags": uint32(m.SnapshotType)}
	if m.MaxVisibleSeqNo != 0 || m.HighCompletedSeqNo != 0 {
		line["max_visible_seqno"] = m.MaxVisibleSeqNo
		line["high_completed_seqno"] = m.HighCompletedSeqNo
	}
	o.send(event{kind: "snapshot", vb: m.VbID, snapStart: m.StartSeqNo, snapEnd: m.EndSeqNo, line: line})
}

func (o *observer) Mutation(m gocbcore.DcpMutation) {
	line := o.withCollection(map[string]any{"event": "mutation", "vb": m.VbID, "seqno": m.SeqNo,
		"rev": m.RevNo, "cas": m.Cas, "key": string(m.Key), "value_len": len(m.Value),
		"flags": m.Flags, "expiry": m.Expiry, "datatype": m.Datatype}, m.CollectionID)
	o.send(event{kind: "data", vb: m.VbID, seqno: m.SeqNo, line: line})
}

func (o *observer) Deletion(d gocbcore.DcpDeletion) {
	line := o.withCollection(map[string]any{"event": "deletion", "vb": d.VbID, "seqno": d.SeqNo,
		"rev": d.RevNo, "cas": d.Cas, "key": string(d.Key), "value_len": len(d.Value)}, d.CollectionID)
	o.send(event{kind: "data", vb: d.VbID, seqno: d.SeqNo, line: line})
}

func (o *observer) Expiration(x gocbcore.DcpExpiration) {
	line := o.withCollection(map[string]any{"event": "expiration", "vb": x.VbID, "seqno": x.SeqNo,
		"rev": x.RevNo, "cas": x.Cas, "key": string(x.Key)}, x.CollectionID)
	o.send(event{kind: "data", vb: x.VbID, seqno: x.SeqNo, line: line})
}

func (o *observer) End(e gocbcore.DcpStreamEnd, err error) {
	line := map[string]any{"event": "end", "vb": e.VbID}
	if err == nil {
		line["reason"] = "ok"
	} else {
		line["reason"] = "error"
		line["error"] = err.Error()
	}
	o.send(event{kind: "end", vb: e.VbID, err: err, line: line})
}

func (o *observer) system(typ string, vb uint16, seqno uint64, fields map[string]any) {
	line := map[string]any{"event": "system", "type": typ, "vb": vb, "seqno": seqno}
	for k, v := range fields {
		line[k] = v
	}
	o.send(event{kind: "data", vb: vb, seqno: seqno, line: line})
}

func (o *observer) CreateCollection(c gocbcore.DcpCollectionCreation) {
	o.system("collection_create", c.VbID, c.SeqNo, map[string]any{"manifest_uid": c.ManifestUID,
		"scope_id": c.ScopeID, "collection_id": c.CollectionID, "name": string(c.Key)})
}

func (o *observer) DeleteCollection(c gocbcore.DcpCollectionDeletion) {
	o.system("collection_delete", c.VbID, c.SeqNo, map[string]any{"manifest_uid": c.ManifestUID,
		"scope_id": c.ScopeID, "collection_id": c.CollectionID})
}

func (o *observer) FlushCollection(c gocbcore.DcpCollectionFlush) {
	o.system("collection_flush", c.VbID, c.SeqNo, map[string]any{"manifest_uid": c.ManifestUID,
		"collection_id": c.CollectionID})
}

func (o *observer) CreateScope(s gocbcore.DcpScopeCreation) {
	o.system("scope_create", s.VbID, s.SeqNo, map[string]any{"manifest_uid": s.ManifestUID,
		"scope_id": s.ScopeID, "name": string(s.Key)})
}

func (o *observer) DeleteScope(s gocbcore.DcpScopeDeletion) {
	o.system("scope_delete", s.VbID, s.SeqNo, map[string]any{"manifest_uid": s.ManifestUID,
		"scope_id": s.ScopeID})
}

func (o *observer) ModifyCollection(c gocbcore.DcpCollectionModification) {
	o.system("collection_modify", c.VbID, c.SeqNo, map[string]any{"manifest_uid": c.ManifestUID,
		"collection_id": c.CollectionID, "ttl": c.Ttl})
}

func (o *observer) OSOSnapshot(s gocbcore.DcpOSOSnapshot) {
	// Never asked for (no enable_out_of_order_snapshots control), so it is a finding.
	o.send(event{kind: "violation", vb: s.VbID, line: map[string]any{"event": "violation",
		"vb": s.VbID, "detail": fmt.Sprintf("OSO snapshot marker (type %d) that was never enabled", s.SnapshotType)}})
}

func (o *observer) SeqNoAdvanced(s gocbcore.DcpSeqNoAdvanced) {
	line := map[string]any{"event": "seqno_advanced", "vb": s.VbID, "seqno": s.SeqNo}
	o.send(event{kind: "advanced", vb: s.VbID, seqno: s.SeqNo, line: line})
}

// stream is the main loop's view of one vBucket's stream.
type stream struct {
	start     vbState
	end       uint64
	open      bool
	done      bool
	last      uint64
	snapStart uint64
	snapEnd   uint64
	inSnap    bool
	vbuuid    uint64
}

// printer writes JSON lines to stdout; safe to call from any goroutine.
type printer struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (p *printer) print(line map[string]any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.enc.Encode(line); err != nil {
		fmt.Fprintf(os.Stderr, "epkv-dcp-check: write stdout: %v\n", err)
	}
}

func main() {
	os.Exit(run(parseFlags()))
}

func usageError(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "epkv-dcp-check: "+format+"\n", args...)
	return exitUsage
}

func run(o options) int {
	out := &printer{enc: json.NewEncoder(os.Stdout)}
	deadline := time.Now().Add(time.Duration(o.timeoutSecs) * time.Second)
	// The loop below honours the deadline; this is the backstop for anything that blocks
	// outside it (a wedged close, a callback that never comes).
	watchdog := time.AfterFunc(time.Until(deadline)+10*time.Second, func() {
		out.print(map[string]any{"event": "error", "op": "watchdog",
			"error": fmt.Sprintf("still running %ds after the %ds timeout", 10, o.timeoutSecs)})
		os.Exit(exitFail)
	})
	defer watchdog.Stop()
	if o.verbose {
		gocbcore.SetLogger(gocbcore.VerboseStdioLogger())
	}
	if o.vbuckets <= 0 || o.vbuckets > 65536 {
		return usageError("--vbuckets must be in 1..65536, not %d", o.vbuckets)
	}
	var endFixed *uint64
	switch o.end {
	case "high":
	case "max":
		v := maxSeqno
		endFixed = &v
	default:
		v, err := strconv.ParseUint(o.end, 0, 64)
		if err != nil {
			return usageError("--end must be high, max or a seqno, not %q", o.end)
		}
		endFixed = &v
	}
	state := map[uint16]vbState{}
	if o.statePath != "" {
		s, err := readState(o.statePath)
		if err != nil {
			return usageError("%v", err)
		}
		state = s
	}
	var endMap map[uint16]uint64
	if o.end == "high" && o.endFile != "" {
		m, err := readEndFile(o.endFile)
		if err != nil {
			return usageError("%v", err)
		}
		endMap = m
	}

	var mechs []gocbcore.AuthMechanism
	for _, m := range strings.Split(o.saslMechs, ",") {
		if m = strings.TrimSpace(m); m != "" {
			mechs = append(mechs, gocbcore.AuthMechanism(m))
		}
	}
	config := gocbcore.DCPAgentConfig{
		UserAgent:  "epkv-dcp-check",
		BucketName: o.bucket,
		// Bootstrap from the KV port only: no HTTPAddrs, so the cluster map comes from the
		// GET_CLUSTER_CONFIG sent while bootstrapping, and the CCCP poller (off by default for
		// DCP agents) keeps it current instead of the HTTP streaming poller, which would
		// otherwise be started against the mgmt port the map advertises.
		SeedConfig: gocbcore.SeedConfig{MemdAddrs: []string{o.addr}},
		SecurityConfig: gocbcore.SecurityConfig{
			Auth:           gocbcore.PasswordAuthProvider{Username: o.user, Password: o.password},
			AuthMechanisms: mechs,
		},
		EnableCCCPPoller: true,
		ConfigPollerConfig: gocbcore.ConfigPollerConfig{
			CccpPollPeriod: time.Duration(o.cccpPollMs) * time.Millisecond,
		},
		IoConfig: gocbcore.IoConfig{UseCollections: o.collections},
		KVConfig: gocbcore.KVConfig{ConnectTimeout: 10 * time.Second},
		DCPConfig: gocbcore.DCPConfig{
			BufferSize:                   o.bufferSize,
			DisableBufferAcknowledgement: o.bufferSize <= 0,
			UseExpiryOpcode:              o.expiryOpcode,
		},
	}
	agent, err := gocbcore.CreateDcpAgent(&config, o.name, memd.DcpOpenFlagProducer)
	if err != nil {
		out.print(map[string]any{"event": "error", "op": "create_agent", "error": err.Error()})
		return exitFail
	}
	defer closeAgent(agent)

	bootstrapDeadline := time.Now().Add(time.Duration(o.bootstrapSecs) * time.Second)
	if bootstrapDeadline.After(deadline) {
		bootstrapDeadline = deadline
	}
	if err := waitUntilReady(agent, bootstrapDeadline); err != nil {
		line := map[string]any{"event": "error", "op": "bootstrap", "error": err.Error()}
		if snap, snapErr := agent.ConfigSnapshot(); snapErr == nil && snap.RevID() < 0 {
			// The connection may be fully set up (DCP_OPEN and DCP_CONTROL answered) and
			// still never become ready: gocbcore drops a cluster map it cannot route with
			// (--verbose logs "Routing data is not valid"), e.g. one whose nodesExt KV node
			// has no entry in `nodes`, or that advertises no mgmt port.
			line["hint"] = "no usable cluster map: gocbcore accepted no GET_CLUSTER_CONFIG reply " +
				"(it needs `nodes` beside `nodesExt`, a `mgmt` port in nodesExt and a vBucketServerMap; run with --verbose)"
		}
		out.print(line)
		fmt.Fprintf(os.Stderr, "epkv-dcp-check: bootstrap (HELLO, SASL, SELECT_BUCKET, GET_CLUSTER_CONFIG, DCP_OPEN, DCP_CONTROL) failed: %v\n", err)
		if hint, ok := line["hint"]; ok {
			fmt.Fprintf(os.Stderr, "epkv-dcp-check: %v\n", hint)
		}
		return exitFail
	}
	if snap, err := agent.ConfigSnapshot(); err == nil {
		if n, err := snap.NumVbuckets(); err == nil && n > 0 && o.vbuckets > n {
			return usageError("--vbuckets %d but bucket %q has %d vBuckets", o.vbuckets, o.bucket, n)
		}
	}

	if o.end == "high" && endMap == nil {
		m, err := highSeqnos(agent, deadline)
		if err != nil {
			out.print(map[string]any{"event": "error", "op": "get_all_vb_seqnos", "error": err.Error()})
			return exitFail
		}
		endMap = m
	}

	// The streams to open: each vBucket from its resume point (or 0) to its end; vBuckets
	// with nothing to stream are left out and keep their old resume point.
	streams := map[uint16]*stream{}
	var needFailover []uint16
	for i := 0; i < o.vbuckets; i++ {
		vb := uint16(i)
		var end uint64
		if endFixed != nil {
			end = *endFixed
		} else {
			end = endMap[vb]
		}
		st, resumed := state[vb]
		if end <= st.Seqno {
			continue
		}
		streams[vb] = &stream{start: st, end: end, last: st.Seqno, snapStart: st.SnapStart, snapEnd: st.SnapEnd, vbuuid: st.VbUUID}
		if !resumed {
			needFailover = append(needFailover, vb)
		}
	}

	// Starting from 0: the vBucket's current UUID is the newest entry of its failover log.
	if err := fetchFailoverLogs(agent, needFailover, streams, deadline); err != nil {
		out.print(map[string]any{"event": "error", "op": "get_failover_log", "error": err.Error()})
		return exitFail
	}

	events := make(chan event, 4096)
	stop := make(chan struct{})
	defer close(stop)
	obs := &observer{events: events, stop: stop, collections: o.collections}

	order := make([]uint16, 0, len(streams))
	for vb := range streams {
		order = append(order, vb)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	for _, vb := range order {
		s := streams[vb]
		out.print(map[string]any{"event": "stream_open", "vb": vb, "vbuuid": s.start.VbUUID, "start": s.start.Seqno,
			"end": s.end, "snap_start": s.start.SnapStart, "snap_end": s.start.SnapEnd})
	}
	go openStreams(agent, order, streams, obs)

	code := loop(o, out, events, streams, deadline)
	if o.statePath != "" {
		for vb, s := range streams {
			if !s.open && s.last == s.start.Seqno {
				continue
			}
			state[vb] = vbState{VbUUID: s.vbuuid, Seqno: s.last, SnapStart: s.snapStart, SnapEnd: s.snapEnd}
		}
		if err := writeState(o.statePath, state); err != nil {
			out.print(map[string]any{"event": "error", "op": "write_state", "error": err.Error()})
			code = exitFail
		}
	}
	return code
}

// loop prints events until every stream is done (or, with --end max, idle), the deadline
// passes or a failure ends the run; returns the exit code.
func loop(o options, out *printer, events <-chan event, streams map[uint16]*stream, deadline time.Time) int {
	pending := len(streams)
	opened := 0
	failed := 0
	count := 0
	code := exitOK
	fail := func(line map[string]any) {
		out.print(line)
		code = exitFail
	}
	idle := time.Duration(o.idleMs) * time.Millisecond
	idleTimer := time.NewTimer(idle)
	defer idleTimer.Stop()
	overall := time.NewTimer(time.Until(deadline))
	defer overall.Stop()
	unbounded := o.end == "max"

	for pending > 0 {
		select {
		case <-overall.C:
			var open []int
			for vb, s := range streams {
				if !s.done {
					open = append(open, int(vb))
				}
			}
			sort.Ints(open)
			fail(map[string]any{"event": "error", "op": "timeout",
				"error": fmt.Sprintf("%d stream(s) still open after %ds: vBuckets %v", len(open), o.timeoutSecs, open)})
			pending = 0
		case <-idleTimer.C:
			if unbounded && opened == len(streams) {
				pending = 0
			} else {
				idleTimer.Reset(idle)
			}
		case e := <-events:
			if !idleTimer.Stop() {
				select {
				case <-idleTimer.C:
				default:
				}
			}
			idleTimer.Reset(idle)
			s := streams[e.vb]
			if s == nil || s.done {
				fail(map[string]any{"event": "violation", "vb": e.vb,
					"detail": fmt.Sprintf("%s event for a vBucket with no open stream", e.kind)})
				continue
			}
			switch e.kind {
			case "opened":
				s.open = true
				opened++
				if len(e.failover) > 0 {
					s.vbuuid = uint64(e.failover[0].VbUUID)
				}
			case "open_failed":
				s.done = true
				pending--
				failed++
				var rb gocbcore.DCPRollbackError
				if errors.As(e.err, &rb) {
					fail(map[string]any{"event": "rollback", "vb": e.vb, "seqno": uint64(rb.SeqNo)})
				} else {
					fail(map[string]any{"event": "error", "vb": e.vb, "op": "stream_request", "error": e.err.Error()})
				}
			case "snapshot":
				out.print(e.line)
				if !s.open {
					fail(violation(e.vb, 0, "snapshot marker before the stream request's response"))
				}
				if e.snapStart > e.snapEnd {
					fail(violation(e.vb, 0, fmt.Sprintf("snapshot [%d, %d] starts after its end", e.snapStart, e.snapEnd)))
				}
				s.snapStart, s.snapEnd, s.inSnap = e.snapStart, e.snapEnd, true
			case "data", "advanced":
				count++
				out.print(e.line)
				switch {
				case e.seqno <= s.last:
					fail(violation(e.vb, e.seqno, fmt.Sprintf("seqno not above the previous %d", s.last)))
				case e.seqno > s.end:
					fail(violation(e.vb, e.seqno, fmt.Sprintf("seqno past the stream's end %d", s.end)))
				case e.kind == "data" && !s.inSnap:
					fail(violation(e.vb, e.seqno, "event before any snapshot marker"))
				case e.kind == "data" && (e.seqno < s.snapStart || e.seqno > s.snapEnd):
					fail(violation(e.vb, e.seqno, fmt.Sprintf("seqno outside its snapshot [%d, %d]", s.snapStart, s.snapEnd)))
				}
				if e.seqno > s.last {
					s.last = e.seqno
				}
			case "end":
				out.print(e.line)
				s.done = true
				pending--
				if e.err != nil {
					failed++
					code = exitFail
				}
			case "violation":
				fail(e.line)
			}
		}
	}
	ended := 0
	for _, s := range streams {
		if s.done {
			ended++
		}
	}
	out.print(map[string]any{"event": "summary", "streams": len(streams), "ended": ended - failed,
		"failed": failed, "events": count, "exit": code})
	return code
}

func violation(vb uint16, seqno uint64, detail string) map[string]any {
	line := map[string]any{"event": "violation", "vb": vb, "detail": detail}
	if seqno != 0 {
		line["seqno"] = seqno
	}
	return line
}

// openStreams sends one DCP_STREAM_REQ per vBucket; results go to the observer's channel
// as "opened" or "open_failed" events, ahead of that stream's first marker.
func openStreams(agent *gocbcore.DCPAgent, order []uint16, streams map[uint16]*stream, obs *observer) {
	for _, vb := range order {
		s := streams[vb]
		vb := vb
		cb := func(entries []gocbcore.FailoverEntry, err error) {
			if err != nil {
				obs.send(event{kind: "open_failed", vb: vb, err: err})
				return
			}
			obs.send(event{kind: "opened", vb: vb, failover: entries})
		}
		_, err := agent.OpenStream(vb, 0, gocbcore.VbUUID(s.start.VbUUID), gocbcore.SeqNo(s.start.Seqno),
			gocbcore.SeqNo(s.end), gocbcore.SeqNo(s.start.SnapStart), gocbcore.SeqNo(s.start.SnapEnd),
			obs, gocbcore.OpenStreamOptions{}, cb)
		if err != nil {
			obs.send(event{kind: "open_failed", vb: vb, err: err})
		}
	}
}

// fetchFailoverLogs sets the start UUID of each vBucket in vbs from its failover log.
func fetchFailoverLogs(agent *gocbcore.DCPAgent, vbs []uint16, streams map[uint16]*stream, deadline time.Time) error {
	type result struct {
		vb      uint16
		entries []gocbcore.FailoverEntry
		err     error
	}
	results := make(chan result, len(vbs))
	for _, vb := range vbs {
		vb := vb
		_, err := agent.GetFailoverLog(vb, func(entries []gocbcore.FailoverEntry, err error) {
			results <- result{vb, entries, err}
		})
		if err != nil {
			return fmt.Errorf("vb %d: %w", vb, err)
		}
	}
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for range vbs {
		select {
		case r := <-results:
			if r.err != nil {
				return fmt.Errorf("vb %d: %w", r.vb, r.err)
			}
			if len(r.entries) == 0 {
				return fmt.Errorf("vb %d: empty failover log", r.vb)
			}
			s := streams[r.vb]
			s.start.VbUUID = uint64(r.entries[0].VbUUID)
			s.vbuuid = s.start.VbUUID
		case <-timeout.C:
			return errors.New("timed out waiting for failover logs")
		}
	}
	return nil
}

// highSeqnos asks the node for every active vBucket's high seqno (GET_ALL_VB_SEQNOS).
func highSeqnos(agent *gocbcore.DCPAgent, deadline time.Time) (map[uint16]uint64, error) {
	type result struct {
		entries []gocbcore.VbSeqNoEntry
		err     error
	}
	ch := make(chan result, 1)
	_, err := agent.GetVbucketSeqnos(0, memd.VbucketStateActive, gocbcore.GetVbucketSeqnoOptions{},
		func(entries []gocbcore.VbSeqNoEntry, err error) { ch <- result{entries, err} })
	if err != nil {
		return nil, err
	}
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		m := make(map[uint16]uint64, len(r.entries))
		for _, e := range r.entries {
			m[e.VbID] = uint64(e.SeqNo)
		}
		return m, nil
	case <-timeout.C:
		return nil, errors.New("timed out waiting for GET_ALL_VB_SEQNOS")
	}
}

func waitUntilReady(agent *gocbcore.DCPAgent, deadline time.Time) error {
	ch := make(chan error, 1)
	_, err := agent.WaitUntilReady(deadline, gocbcore.WaitUntilReadyOptions{},
		func(_ *gocbcore.WaitUntilReadyResult, err error) { ch <- err })
	if err != nil {
		return err
	}
	return <-ch
}

// closeAgent closes the agent, giving up after a few seconds so that a wedged connection
// cannot hold the process past its timeout.
func closeAgent(agent *gocbcore.DCPAgent) {
	done := make(chan struct{})
	go func() {
		if err := agent.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "epkv-dcp-check: close: %v\n", err)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		fmt.Fprintln(os.Stderr, "epkv-dcp-check: agent did not close within 5s")
	}
}

func readState(path string) (map[uint16]vbState, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[uint16]vbState{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}
	var raw map[string]vbState
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parse state %s: %w", path, err)
	}
	out := make(map[uint16]vbState, len(raw))
	for k, v := range raw {
		vb, err := strconv.ParseUint(k, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("state %s: key %q is not a vBucket id", path, k)
		}
		if v.SnapStart > v.Seqno || v.Seqno > v.SnapEnd {
			return nil, fmt.Errorf("state %s: vb %d: seqno %d outside its snapshot [%d, %d]", path, vb, v.Seqno, v.SnapStart, v.SnapEnd)
		}
		out[uint16(vb)] = v
	}
	return out, nil
}

func readEndFile(path string) (map[uint16]uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read end file %s: %w", path, err)
	}
	var raw map[string]uint64
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parse end file %s: %w", path, err)
	}
	out := make(map[uint16]uint64, len(raw))
	for k, v := range raw {
		vb, err := strconv.ParseUint(k, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("end file %s: key %q is not a vBucket id", path, k)
		}
		out[uint16(vb)] = v
	}
	return out, nil
}

// writeState replaces the state file (write to a temporary file, then rename).
func writeState(path string, state map[uint16]vbState) error {
	raw := make(map[string]vbState, len(state))
	for vb, s := range state {
		raw[strconv.Itoa(int(vb))] = s
	}
	data, err := json.MarshalIndent(raw, "", " ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".dcp-state-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
