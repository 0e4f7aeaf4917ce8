//! Opting the process out of transparent huge pages.
//!
//! Key-value servers grow their heap in small steps while they fill. With THP, mimalloc
//! asks for huge pages and every first touch of a 2 MiB region makes the kernel zero the
//! whole region: under memaslap (100% SET, 512-byte values) that zeroing (`clear_page_erms`)
//! was 13-16% of the server's CPU, and memcached paid none of it. Redis and memcached
//! deployments disable THP for the same reason (and for the latency spikes of
//! compaction); epkv does it for its own process only, leaving the system setting alone.

/// Disables THP for this process (prctl `PR_SET_THP_DISABLE`), before any worker thread
/// starts. Failure is harmless (older kernels): it is logged and the server carries on.
pub(crate) fn disable_for_process() {
    // SAFETY: PR_SET_THP_DISABLE takes only integer arguments and touches no memory of
    // ours; the call cannot violate memory safety.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "cannot disable transparent huge pages for this process"
        );
    }
}
