//! [`StopSignal`]: the connection loop's cheap check for the front end stopping.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::sync::watch;

/// Resolves once the front end is stopping (the watch channel says true or its sender is
/// gone).
///
/// It is polled on every pass of the connection loop, so it is made cheap: once a poll
/// has registered the task's waker with the channel, later polls by the same task only
/// compare the channel's version (one atomic load) until a stop is actually signalled;
/// polling the channel's wait future every time took a lock per pass.
pub(crate) struct StopSignal {
    peek: watch::Receiver<bool>,
    wait: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The waker the wait future last registered, if a poll left it pending.
    armed: Option<Waker>,
}

impl StopSignal {
    /// A signal that resolves once `stop` says true or its sender is gone.
    pub(crate) fn new(stop: watch::Receiver<bool>) -> Self {
        let mut rx = stop.clone();
        Self {
            peek: stop,
            wait: Box::pin(async move {
                if !*rx.borrow_and_update() {
                    let _ = rx.changed().await;
                }
            }),
            armed: None,
        }
    }
}

impl Future for StopSignal {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(w) = &self.armed
            && w.will_wake(cx.waker())
            && matches!(self.peek.has_changed(), Ok(false))
        {
            return Poll::Pending;
        }
        let polled = self.wait.as_mut().poll(cx);
        self.armed = polled.is_pending().then(|| cx.waker().clone());
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn poll_once(s: &mut StopSignal) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *s).poll(cx))).await
    }

    #[tokio::test]
    async fn stop_signal_stays_pending_then_wakes_its_task_on_stop() {
        let (tx, rx) = watch::channel(false);
        let mut s = StopSignal::new(rx);
        for _ in 0..3 {
            assert!(poll_once(&mut s).await.is_pending());
        }
        let waiter = tokio::spawn(async move {
            for _ in 0..3 {
                assert!(poll_once(&mut s).await.is_pending());
            }
            s.await;
        });
        tokio::task::yield_now().await;
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the stopped signal wakes the task that polled it")
            .unwrap();
    }

    #[tokio::test]
    async fn stop_signal_resolves_when_already_stopped_or_the_sender_is_gone() {
        let (tx, rx) = watch::channel(true);
        let mut s = StopSignal::new(rx);
        assert!(poll_once(&mut s).await.is_ready());
        drop(tx);
        let (tx, rx) = watch::channel(false);
        let mut s = StopSignal::new(rx);
        assert!(poll_once(&mut s).await.is_pending());
        drop(tx);
        tokio::time::timeout(Duration::from_secs(10), s)
            .await
            .expect("a dropped sender stops the connection");
    }
}
