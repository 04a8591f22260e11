//! How a driver notices its shutdown and pinglist watches at no cost per turn.
//!
//! Awaiting `changed()` in every turn's `select!` adds a waiter to each channel and removes
//! it again, under the channel's lock: at tens of thousands of turns a second that cost
//! more than the driver's own work per probe. Instead each channel gets one waiter, on a
//! clone of its receiver, polled once so that it holds the driver task's waker: a change
//! wakes the task without the waiter being polled again, and the turn's `select!` sees it
//! through [`DriverWatches::changed`], two atomic loads. A waiter is made anew only after
//! a change was taken.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::watch;

use crate::targets::Pinglists;

type Waiter = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One registered waiter per watch (None: to be made and polled before the next wait).
#[derive(Default)]
pub(super) struct DriverWatches {
    shutdown: Option<Waiter>,
    pinglists: Option<Waiter>,
}

impl DriverWatches {
    /// Registers a waiter on each watch that has none (the pinglists only while their
    /// sender lives). Must be awaited by the driver's own task: the waiters wake the task
    /// that polled them.
    pub(super) async fn arm(
        &mut self,
        shutdown: &watch::Receiver<bool>,
        pinglists: &watch::Receiver<Arc<Pinglists>>,
        pinglists_open: bool,
    ) {
        if self.shutdown.is_none() {
            self.shutdown = registered(shutdown).await;
        }
        if pinglists_open && self.pinglists.is_none() {
            self.pinglists = registered(pinglists).await;
        }
    }

    /// True when either watch has a change the driver has not taken (or lost its sender).
    pub(super) fn changed(
        shutdown: &watch::Receiver<bool>,
        pinglists: &watch::Receiver<Arc<Pinglists>>,
        pinglists_open: bool,
    ) -> bool {
        shutdown.has_changed().unwrap_or(true)
            || (pinglists_open && pinglists.has_changed().unwrap_or(true))
    }

    /// The driver took a change: the waiters that fired for it are spent.
    pub(super) fn taken(&mut self) {
        *self = DriverWatches::default();
    }
}

/// A waiter for `rx`'s next change, polled once; None when it was ready at once (a change
/// the driver has not taken yet: it is taken next turn and the waiter made again).
async fn registered<T: Send + Sync + 'static>(rx: &watch::Receiver<T>) -> Option<Waiter> {
    let mut rx = rx.clone();
    let mut waiter: Waiter = Box::pin(async move {
        let _ = rx.changed().await;
    });
    let ready = poll_fn(|cx| Poll::Ready(waiter.as_mut().poll(cx).is_ready())).await;
    (!ready).then_some(waiter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The driver's wait: its watches armed, then the turn's check as the only branch
    /// that looks at them.
    async fn wait_for_change(
        w: &mut DriverWatches,
        s: &watch::Receiver<bool>,
        p: &watch::Receiver<Arc<Pinglists>>,
    ) {
        w.arm(s, p, true).await;
        poll_fn(|_| {
            if DriverWatches::changed(s, p, true) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    #[tokio::test]
    async fn a_change_wakes_the_wait_although_no_waiter_is_polled_in_it() {
        let (stx, mut srx) = watch::channel(false);
        let (ptx, mut prx) = watch::channel(Arc::new(Pinglists::default()));
        let mut w = DriverWatches::default();
        for round in 0..3 {
            let sender = tokio::spawn({
                let ptx = ptx.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    ptx.send_modify(|_| {});
                }
            });
            tokio::time::timeout(Duration::from_secs(5), wait_for_change(&mut w, &srx, &prx))
                .await
                .unwrap_or_else(|_| {
                    panic!("round {round}: the pinglist change never woke the wait")
                });
            sender.await.unwrap();
            // The driver takes the change; its waiters are spent and made again.
            prx.borrow_and_update();
            w.taken();
        }
        stx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), wait_for_change(&mut w, &srx, &prx))
            .await
            .expect("shutdown never woke the wait");
        assert!(*srx.borrow_and_update());
        drop(ptx);
    }
}
