//! Property tests: request and response round trips through the framing, parse and decode
//! path, and arbitrary bytes never panicking the decoder.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers panic on failure by design"
)]

use epkv_protocol::{
    ArithmeticOp, Command, DurabilityRequirement, HelloFeatures, Limits, Request, RequestBuilder,
    Response, Status, StoreOp, frame_len, response_frame_len,
};
use epkv_types::{Cas, Datatype, DurabilityLevel, VBucketState, Vbid};
use proptest::prelude::*;
use std::time::Duration;

/// Owned inputs from which a valid [`Command`] is built (commands borrow their bytes).
#[derive(Debug, Clone)]
struct Inputs {
    variant: u8,
    quiet: bool,
    flag: bool,
    key: Vec<u8>,
    value: Vec<u8>,
    a: u64,
    b: u64,
    c: u32,
    durability: Option<DurabilityRequirement>,
    vbid: u16,
    opaque: u32,
}

fn durability() -> impl Strategy<Value = Option<DurabilityRequirement>> {
    prop::option::of(
        (1u8..=3, prop::option::of(1u16..=0xfffe)).prop_map(|(level, ms)| DurabilityRequirement {
            level: DurabilityLevel::from_u8(level).unwrap(),
            timeout: ms.map(|ms| Duration::from_millis(u64::from(ms))),
        }),
    )
}

fn inputs() -> impl Strategy<Value = Inputs> {
    (
        (0u8..19, any::<bool>(), any::<bool>()),
        prop::collection::vec(any::<u8>(), 1..=250),
        prop::collection::vec(any::<u8>(), 0..64),
        (any::<u64>(), any::<u64>(), any::<u32>()),
        durability(),
        (any::<u16>(), any::<u32>()),
    )
        .prop_map(
            |((variant, quiet, flag), key, value, (a, b, c), durability, (vbid, opaque))| Inputs {
                variant,
                quiet,
                flag,
                key,
                value,
                a,
                b,
                c,
                durability,
                vbid,
                opaque,
            },
        )
}

/// Builds a command that satisfies every validation rule from the inputs.
fn command(i: &Inputs) -> Command<'_> {
    let key = &i.key[..];
    let quiet = i.quiet;
    // Durability only on non-quiet mutations (kv_engine's table).
    let durable = if quiet { None } else { i.durability };
    let store_op = [
        StoreOp::Set,
        StoreOp::Add,
        StoreOp::Replace,
        StoreOp::Append,
        StoreOp::Prepend,
    ][(i.a % 5) as usize];
    match i.variant {
        0 => Command::Get {
            key,
            with_key: i.flag,
            quiet,
        },
        1 => {
            let (flags, expiry) = match store_op {
                StoreOp::Append | StoreOp::Prepend => (0, 0),
                _ => (i.c, (i.b >> 32) as u32),
            };
            Command::Store {
                op: store_op,
                key,
                value: &i.value,
                flags,
                expiry,
                datatype: if i.flag {
                    Datatype::JSON
                } else {
                    Datatype::RAW
                },
                cas: if store_op == StoreOp::Add {
                    Cas::ANY
                } else {
                    Cas(i.b)
                },
                durability: durable,
                preserve_ttl: store_op != StoreOp::Add && i.a & 0x100 != 0,
                quiet,
            }
        }
        2 => Command::Delete {
            key,
            cas: Cas(i.b),
            durability: durable,
            quiet,
        },
        3 => Command::Arithmetic {
            op: if i.flag {
                ArithmeticOp::Increment
            } else {
                ArithmeticOp::Decrement
            },
            key,
            delta: i.a,
            initial: i.b,
            expiry: i.c,
            durability: durable,
            preserve_ttl: i.a & 1 == 1,
            quiet,
        },
        4 => Command::Quit { quiet },
        5 => Command::Flush { quiet },
        6 => Command::Noop,
        7 => Command::Version,
        8 => Command::Stat {
            group: if i.flag { key } else { &[] },
        },
        9 => Command::Verbosity { level: i.c },
        10 => Command::Touch {
            key,
            expiry: i.c,
            durability: i.durability,
        },
        11 => Command::Gat {
            key,
            expiry: i.c,
            durability: durable,
            quiet,
        },
        12 => {
            let even = i.value.len() & !1;
            Command::Hello {
                agent: if i.flag { key } else { &[] },
                features: HelloFeatures::new(&i.value[..even]),
            }
        }
        13 => Command::GetLocked {
            key,
            lock_timeout_secs: i.c,
        },
        14 => Command::UnlockKey {
            key,
            cas: Cas(i.b.max(1)),
        },
        15 => Command::SetVbucket {
            state: VBucketState::from_u8((i.c % 4) as u8 + 1).unwrap(),
        },
        16 => Command::GetVbucket,
        _ => Command::AdjustTimeofday {
            offset_secs: i.a.cast_signed(),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn request_round_trips_through_frame_parse_decode(i in inputs()) {
        let limits = Limits::default();
        let cmd = command(&i);
        let wire = RequestBuilder::from_command(&cmd)
            .vbucket(Vbid(i.vbid))
            .opaque(i.opaque)
            .to_vec()
            .unwrap();
        prop_assert_eq!(frame_len(&wire, &limits), Ok(Some(wire.len())));
        // Every strict prefix asks for more bytes.
        prop_assert_eq!(frame_len(&wire[..wire.len() - 1], &limits), Ok(None));
        let req = Request::parse(&wire, &limits).unwrap();
        prop_assert_eq!(req.packet_len(), wire.len());
        prop_assert_eq!(req.header.vbucket, Vbid(i.vbid));
        prop_assert_eq!(req.header.opaque, i.opaque);
        prop_assert_eq!(req.opcode(), Some(cmd.opcode()));
        prop_assert_eq!(Command::decode(&req), Ok(cmd));
    }

    #[test]
    fn pipelined_requests_are_framed_one_by_one(all in prop::collection::vec(inputs(), 1..20)) {
        let limits = Limits::default();
        let mut wire = Vec::new();
        for i in &all {
            RequestBuilder::from_command(&command(i)).opaque(i.opaque).encode(&mut wire).unwrap();
        }
        let mut rest = &wire[..];
        for i in &all {
            let n = frame_len(rest, &limits).unwrap().unwrap();
            let req = Request::parse(&rest[..n], &limits).unwrap();
            prop_assert_eq!(req.header.opaque, i.opaque);
            prop_assert_eq!(Command::decode(&req), Ok(command(i)));
            rest = &rest[n..];
        }
        prop_assert!(rest.is_empty());
    }

    #[test]
    fn response_round_trips(
        opcode in any::<u8>(),
        status in any::<u16>(),
        opaque in any::<u32>(),
        cas in any::<u64>(),
        datatype in any::<u8>(),
        framing in prop::collection::vec(any::<u8>(), 0..8),
        extras in prop::collection::vec(any::<u8>(), 0..24),
        key in prop::collection::vec(any::<u8>(), 0..255),
        value in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let limits = Limits::default();
        let mut r = Response::new(opcode, Status::Success, opaque)
            .with_cas(Cas(cas))
            .with_datatype(Datatype(datatype))
            .with_framing_extras(&framing)
            .with_extras(&extras)
            .with_key(&key)
            .with_value(&value);
        r.status = status;
        let mut out = bytes::BytesMut::new();
        r.encode(&mut out).unwrap();
        prop_assert_eq!(out.len(), r.encoded_len());
        prop_assert_eq!(out[0], if framing.is_empty() { 0x81 } else { 0x18 });
        prop_assert_eq!(response_frame_len(&out, &limits), Ok(Some(out.len())));
        prop_assert_eq!(response_frame_len(&out[..out.len() - 1], &limits), Ok(None));
        prop_assert_eq!(Response::parse(&out, &limits), Ok(r));
        // A response is never accepted as a request.
        prop_assert!(frame_len(&out, &limits).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
        let limits = Limits { max_packet_bytes: 4096 };
        let mut rest = &data[..];
        while let Ok(Some(n)) = frame_len(rest, &limits) {
            prop_assert!(n <= rest.len() && n >= 24);
            let req = Request::parse(&rest[..n], &limits).unwrap();
            let _ = Command::decode(&req);
            let _ = req.frame_info();
            rest = &rest[n..];
        }
        let _ = Response::parse(&data, &limits);
        let _ = response_frame_len(&data, &limits);
    }

    #[test]
    fn corrupted_valid_requests_never_panic(
        i in inputs(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let limits = Limits::default();
        let mut wire = RequestBuilder::from_command(&command(&i)).to_vec().unwrap();
        for (at, byte) in flips {
            let at = at.index(wire.len());
            wire[at] = byte;
        }
        if let Ok(Some(n)) = frame_len(&wire, &limits) {
            prop_assert!(n <= wire.len());
            let req = Request::parse(&wire[..n], &limits).unwrap();
            if let Ok(cmd) = Command::decode(&req) {
                // Whatever decodes re-encodes to the same command.
                let again = RequestBuilder::from_command(&cmd).to_vec().unwrap();
                let req2 = Request::parse(&again, &limits).unwrap();
                prop_assert_eq!(Command::decode(&req2), Ok(cmd));
            }
        }
    }
}
