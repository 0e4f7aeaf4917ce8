//! Fitting `max-connections` to the process's open-file limit (RLIMIT_NOFILE).

/// File descriptors kept for everything but client connections: the listener, stdio,
/// log files and, later, data files.
const BASE_RESERVE: u64 = 64;
/// Descriptors each worker thread's runtime uses (epoll and its wake-up eventfd, with
/// margin).
const PER_THREAD_RESERVE: u64 = 4;

/// Returns the connection limit to use: `wanted`, unless the open-file limit cannot fit it
/// plus a reserve. Raises the soft limit towards the hard limit first (as memcached does);
/// if that is not enough, warns and clamps.
pub(crate) fn clamp_connections(wanted: usize, threads: usize) -> usize {
    let reserve = BASE_RESERVE + PER_THREAD_RESERVE * threads as u64;
    let Some((soft, hard)) = nofile_limit() else {
        tracing::warn!("cannot read RLIMIT_NOFILE; keeping max-connections {wanted}");
        return wanted;
    };
    let needed = (wanted as u64).saturating_add(reserve);
    let mut soft = soft;
    if soft < needed && hard > soft {
        let target = needed.min(hard);
        if raise_nofile_limit(target, hard) {
            tracing::info!(from = soft, to = target, "raised the open-file limit");
            soft = target;
        }
    }
    let available = soft.saturating_sub(reserve);
    if (wanted as u64) > available {
        let clamped = usize::try_from(available.max(1)).unwrap_or(usize::MAX);
        tracing::warn!(
            wanted,
            clamped,
            open_file_limit = soft,
            reserve,
            "max-connections does not fit the open-file limit (ulimit -n); clamping it"
        );
        clamped
    } else {
        wanted
    }
}

/// Returns (soft, hard) RLIMIT_NOFILE.
fn nofile_limit() -> Option<(u64, u64)> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid, writable `rlimit` for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) };
    (rc == 0).then_some((rl.rlim_cur, rl.rlim_max))
}

/// Sets the soft RLIMIT_NOFILE; returns whether it worked.
fn raise_nofile_limit(soft: u64, hard: u64) -> bool {
    let rl = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `rl` is a valid `rlimit` read by the call.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
    rc == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_limits_pass_through_and_huge_ones_are_clamped() {
        assert_eq!(clamp_connections(10, 2), 10);
        let (_, hard) = nofile_limit().unwrap();
        let huge = usize::try_from(hard)
            .unwrap_or(usize::MAX / 2)
            .saturating_add(1_000_000);
        let got = clamp_connections(huge, 2);
        assert!(got < huge);
        assert!(got >= 1);
    }
}
