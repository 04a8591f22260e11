//! The driver's deadline timer: a timerfd (CLOCK_MONOTONIC, absolute) in the runtime's
//! epoll set, next to the transport's socket. tokio's timer wheel wakes its driver once
//! more for a deadline past 64 ms (to move it down a level) and writes an eventfd to
//! re-arm for an earlier one; a probing round (100 ms) paid both every round.
//! A timerfd wakes only when its deadline passes, and re-arming it is one syscall.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub struct DeadlineTimer {
    fd: AsyncFd<OwnedFd>,
    armed_ns: Option<u64>,
}

impl DeadlineTimer {
    /// Must be called inside a tokio runtime (the fd joins its reactor).
    pub fn new() -> io::Result<DeadlineTimer> {
        // SAFETY: plain timerfd_create(2) call.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and the same
        // for the AsyncFd's whole lifetime.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(DeadlineTimer { fd, armed_ns: None })
    }

    /// Fires at `deadline_ns` (CLOCK_MONOTONIC, `clock::monotonic_ns`); a deadline
    /// already past fires at once. Re-arming for the armed deadline is free.
    pub fn arm(&mut self, deadline_ns: u64) -> io::Result<()> {
        if self.armed_ns == Some(deadline_ns) {
            return Ok(());
        }
        // it_value 0 would disarm: a deadline at 0 (always past) becomes 1 ns.
        let at = deadline_ns.max(1);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: a valid timerfd and a fully initialised itimerspec; no old value wanted.
        let r = unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            self.armed_ns = None;
            return Err(io::Error::last_os_error());
        }
        self.armed_ns = Some(deadline_ns);
        Ok(())
    }

    /// Waits until the armed deadline passes (forever when none is armed).
    pub async fn expired(&mut self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut ticks = [0u8; 8];
            // SAFETY: reads at most 8 bytes into an 8-byte buffer.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    ticks.as_mut_ptr() as *mut libc::c_void,
                    ticks.len(),
                )
            };
            if n == 8 {
                // One-shot and disarmed now: its next edge needs a new `arm`, so the
                // readiness can go without a read that would only say EAGAIN.
                guard.clear_ready();
                self.armed_ns = None;
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                // Re-armed since the edge (settime clears the count): wait for the next.
                io::ErrorKind::WouldBlock => guard.clear_ready(),
                io::ErrorKind::Interrupted => {}
                _ => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_verbs::clock::monotonic_ns;
    use std::time::Duration;

    #[tokio::test]
    async fn fires_at_its_deadline_and_follows_a_re_arm() {
        let mut t = DeadlineTimer::new().unwrap();
        let start = monotonic_ns();
        t.arm(start + 20_000_000).unwrap();
        // Moved earlier before it fired: the earlier deadline wins.
        t.arm(start + 5_000_000).unwrap();
        t.expired().await.unwrap();
        let waited = monotonic_ns() - start;
        assert!(waited >= 5_000_000, "fired after {waited} ns");
        assert!(waited < 20_000_000, "the re-arm was ignored: {waited} ns");
        // A past deadline fires at once; nothing armed never fires.
        t.arm(1).unwrap();
        t.expired().await.unwrap();
        let never = tokio::time::timeout(Duration::from_millis(30), t.expired()).await;
        assert!(never.is_err(), "fired with no deadline armed");
    }

    #[tokio::test]
    async fn a_re_arm_after_the_edge_waits_for_the_new_deadline() {
        let mut t = DeadlineTimer::new().unwrap();
        t.arm(monotonic_ns()).unwrap();
        std::thread::sleep(Duration::from_millis(2)); // the old deadline passes unread
        let start = monotonic_ns();
        t.arm(start + 10_000_000).unwrap();
        t.expired().await.unwrap();
        let waited = monotonic_ns() - start;
        assert!(
            waited >= 10_000_000,
            "fired on the stale edge after {waited} ns"
        );
    }
}
