//! The FUSE thread as the runtime's own driver, on a machine of few cores. With a worker
//! runtime every request that waits on the network crosses threads twice: the FUSE thread
//! wakes a worker (which sends the request), and the worker sleeps until the answer. Here the
//! runtime is a current-thread one, and the FUSE thread drives it between requests: after
//! each request it runs the runtime (every task, timer and socket) until the kernel has the
//! next request ready, so a small file's read is sent, answered and replied to on one thread.
//!
//! fuser reads `/dev/fuse` blocking; the thread only ever gets there once a request is
//! pending, which it learns from a duplicate of the descriptor registered with the runtime.
//! A few paths leave fuser's loop without passing through here (fuser answers some requests
//! itself, the operations the adapter leaves to fuser's defaults answer ENOSYS without a
//! turn, and the first request after the handshake has no turn before it), and once the
//! session ends there are no turns at all: a standby thread drives the runtime while the
//! FUSE thread has been away for a whole `STANDBY_CHECK`, and hands it back as soon as the
//! FUSE thread returns.

use futures::FutureExt;
use std::future::Future;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::Runtime;
use tokio::sync::Notify;

/// How long the FUSE thread may be away from the runtime before the standby thread drives
/// it: the longest a background task (a signal, an upload) waits on an idle mount.
const STANDBY_CHECK: Duration = Duration::from_millis(20);

/// A current-thread runtime and the FUSE session whose thread drives it.
pub(super) struct Driven {
    rt: Arc<Runtime>,
    /// The session's `/dev/fuse`, registered with `rt` for its readiness only: never read.
    requests: OnceLock<AsyncFd<OwnedFd>>,
    /// The FUSE thread is inside the runtime (or about to be).
    inside: AtomicBool,
    /// Times the FUSE thread has left the runtime to serve a request.
    turns: AtomicU64,
    /// The standby thread goes on standing by (until the mount is finished).
    standing_by: AtomicBool,
    /// The standby thread, to wake when it sleeps until the FUSE thread leaves the runtime.
    standby: OnceLock<std::thread::Thread>,
    /// The standby thread sleeps until the FUSE thread leaves the runtime: an idle mount's
    /// FUSE thread waits inside, and nothing then wakes the standby thread for nothing.
    standby_asleep: AtomicBool,
    /// The session has ended: no turn comes again.
    session_over: AtomicBool,
    /// The standby thread drives the runtime now.
    standing_in: AtomicBool,
    /// The FUSE thread went back to the kernel without a turn (`hand_over`): the standby
    /// drives the runtime at once rather than after `STANDBY_CHECK`.
    handed_over: AtomicBool,
    /// Wakes the standby thread's drive, so that it gives the runtime back.
    give_back: Notify,
}

impl Driven {
    /// The driver of `rt`, which must be a current-thread runtime.
    pub(super) fn new(rt: Arc<Runtime>) -> Driven {
        Driven {
            rt,
            requests: OnceLock::new(),
            inside: AtomicBool::new(false),
            turns: AtomicU64::new(0),
            standing_by: AtomicBool::new(true),
            standby: OnceLock::new(),
            standby_asleep: AtomicBool::new(false),
            session_over: AtomicBool::new(false),
            standing_in: AtomicBool::new(false),
            handed_over: AtomicBool::new(false),
            give_back: Notify::new(),
        }
    }

    /// Registers the session's descriptor (a duplicate of it), whose readiness ends each turn.
    pub(super) fn watch(&self, fuse: OwnedFd) -> std::io::Result<()> {
        let _runtime = self.rt.enter();
        // SAFETY: an OwnedFd stays open, and is the same descriptor, until the AsyncFd that
        // owns it is dropped.
        let watched = unsafe { AsyncFd::register_with_interest(fuse, Interest::READABLE) }?;
        let _ = self.requests.set(watched);
        Ok(())
    }

    /// Polls `answer` once here and leaves it to the runtime as a task if it has to wait;
    /// the runtime runs it at the end of this request's turn.
    pub(super) fn answer(&self, answer: impl Future<Output = ()> + Send + 'static) {
        self.inside(async move {
            let mut answer = Box::pin(answer);
            let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
            if answer.as_mut().poll(&mut cx).is_pending() {
                tokio::spawn(answer);
            }
        });
    }

    /// Runs `f`, which needs no wait, on this thread holding the runtime. A task it spawns
    /// joins the runtime's own queue, to run at the end of this request's turn; spawned from
    /// outside, it would be handed over with a wake-up of the runtime's driver (a write to
    /// its eventfd, and a pass through epoll to take it back). While the standby thread
    /// drives the runtime, `block_on` polls `f` here without the runtime, and a task it
    /// spawns is handed over as from outside: correct, only not cheaper.
    pub(super) fn at_once<T>(&self, f: impl FnOnce() -> T) -> T {
        self.inside(async move { f() })
    }

    /// Runs the runtime until the kernel has the next request ready (or the session ended):
    /// the end of every request's turn.
    pub(super) fn until_next_request(&self) {
        let Some(requests) = self.requests.get() else {
            return;
        };
        self.inside(next_request(requests));
        self.turns.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `f` to completion on the runtime, taking it back from the standby thread first.
    fn inside<T>(&self, f: impl Future<Output = T>) -> T {
        self.inside.store(true, Ordering::SeqCst);
        if self.standing_in.load(Ordering::SeqCst) {
            self.give_back.notify_waiters();
        }
        // Left however `f` ends: a panic that left `inside` set would have the standby wait
        // for the FUSE thread to leave for ever, and nothing would drive the runtime again.
        let _leaving = Leaving(self);
        self.rt.block_on(f)
    }

    /// The FUSE thread has left the runtime: the standby may need to drive it.
    fn left(&self) {
        self.inside.store(false, Ordering::SeqCst);
        if self.standby_asleep.swap(false, Ordering::SeqCst) {
            self.wake_standby();
        }
    }

    /// Called by the FUSE thread for a request it leaves without a turn: the standby thread
    /// drives the runtime from now until the FUSE thread next comes into it.
    pub(super) fn hand_over(&self) {
        self.handed_over.store(true, Ordering::SeqCst);
        self.wake_standby();
    }

    fn wake_standby(&self) {
        if let Some(standby) = self.standby.get() {
            standby.unpark();
        }
    }

    /// The standby thread's loop, until `stop_standing_by`: drives the runtime whenever the
    /// FUSE thread has been away from it for a whole `STANDBY_CHECK` without a turn, at once
    /// when it was handed over, and for good once the session has ended; sleeps while the
    /// FUSE thread waits inside it.
    pub(super) fn stand_by(&self) {
        let _ = self.standby.set(std::thread::current());
        let mut seen = self.turns.load(Ordering::Relaxed);
        while self.standing_by.load(Ordering::Acquire) {
            // Asked before sleeping too: the wake-up of a hand-over may have been spent on
            // the sleep below that waits out the FUSE thread's stay inside.
            let handed_over = self.handed_over.swap(false, Ordering::SeqCst) || {
                std::thread::park_timeout(STANDBY_CHECK);
                self.handed_over.swap(false, Ordering::SeqCst)
            };
            if self.session_over.load(Ordering::Acquire) {
                self.rt.block_on(self.stand_in());
                continue;
            }
            if self.inside.load(Ordering::SeqCst) {
                // Marked asleep before asking again: if the FUSE thread leaves in between,
                // either this sees it leave or it sees the mark and wakes this thread.
                self.standby_asleep.store(true, Ordering::SeqCst);
                if self.inside.load(Ordering::SeqCst) && self.standing_by.load(Ordering::Acquire) {
                    std::thread::park();
                }
                self.standby_asleep.store(false, Ordering::SeqCst);
                seen = self.turns.load(Ordering::Relaxed);
                continue;
            }
            let turns = self.turns.load(Ordering::Relaxed);
            if turns != seen && !handed_over {
                seen = turns;
                continue;
            }
            self.rt.block_on(self.stand_in());
            seen = self.turns.load(Ordering::Relaxed);
        }
    }

    /// Called by the FUSE thread as it leaves for good: the standby drives the runtime from
    /// now on, at once, so that whoever waits for the session's end hears of it.
    pub(super) fn session_ended(&self) {
        self.session_over.store(true, Ordering::Release);
        self.wake_standby();
    }

    /// Ends `stand_by`, waking the standby thread wherever it waits.
    pub(super) fn stop_standing_by(&self) {
        self.standing_by.store(false, Ordering::Release);
        self.wake_standby();
        self.give_back.notify_waiters();
    }

    /// Drives the runtime until the FUSE thread comes back to it or the standby stops.
    async fn stand_in(&self) {
        self.standing_in.store(true, Ordering::SeqCst);
        loop {
            let notified = self.give_back.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inside.load(Ordering::SeqCst) || !self.standing_by.load(Ordering::Acquire) {
                break;
            }
            tokio::select! {
                _ = notified => break,
                _ = tokio::time::sleep(STANDBY_CHECK) => {}
            }
        }
        self.standing_in.store(false, Ordering::SeqCst);
    }
}

/// Marks the FUSE thread's stay inside the runtime over when dropped (see `Driven::inside`).
struct Leaving<'a>(&'a Driven);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.0.left();
    }
}

/// Resolves once `/dev/fuse` has a request to read, or an error (the session ended).
/// Readiness is edge-triggered and one edge may stand for several requests, so the queue
/// itself is asked each time the readiness is cleared: a request that came before the clear
/// is seen there, one that comes after raises a fresh edge.
async fn next_request(requests: &AsyncFd<OwnedFd>) {
    const WATCHED: Interest = Interest::READABLE.add(Interest::ERROR);
    // One pass of the runtime first, even when the next request is already waiting: else a
    // sequential reader's read-ahead window of requests is all taken in before any data is
    // received (a 1 GiB read ran 0.73x as fast, with twice the emulator's CPU per GiB).
    tokio::task::yield_now().await;
    // Readiness still standing is mostly an edge whose requests fuser has read since. It is
    // cleared before the queue is asked (which sees any request that is there), so that a
    // wait asks the queue once rather than finding the readiness stale after a first ask.
    match requests.ready(WATCHED).now_or_never() {
        Some(Ok(mut standing)) => standing.clear_ready(),
        Some(Err(_)) => return,
        None => {}
    }
    loop {
        if request_pending(requests.as_raw_fd()) {
            return;
        }
        match requests.ready(WATCHED).await {
            Ok(mut ready) => ready.clear_ready(),
            Err(_) => return,
        }
    }
}

/// Whether the kernel has something for the FUSE thread on `fd` (a request, or an error).
fn request_pending(fd: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait; poll writes only its revents.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    ready != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::mpsc;

    fn current_thread() -> Arc<Runtime> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Arc::new(rt)
    }

    /// A `Driven` watching the read end of a pipe, which stands in for `/dev/fuse`: a byte
    /// in the pipe is a pending request.
    fn driven_by_pipe() -> (Driven, std::io::PipeReader, std::io::PipeWriter) {
        let driven = Driven::new(current_thread());
        let (rx, tx) = std::io::pipe().expect("pipe");
        driven
            .watch(rx.try_clone().expect("dup").into())
            .expect("registered");
        (driven, rx, tx)
    }

    #[test]
    fn a_turn_ends_at_each_pending_request_however_many_one_wake_up_stood_for() {
        let (driven, mut rx, mut tx) = driven_by_pipe();
        tx.write_all(b"ab").expect("two requests");
        let mut one = [0u8; 1];
        driven.until_next_request();
        rx.read_exact(&mut one).expect("first");
        // No new wake-up comes for the second request: the turn must see it anyway.
        driven.until_next_request();
        rx.read_exact(&mut one).expect("second");
        assert_eq!(one, *b"b");
        let written = Arc::new(AtomicBool::new(false));
        let writer = {
            let written = written.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                written.store(true, Ordering::SeqCst);
                tx.write_all(b"c").expect("third");
                tx
            })
        };
        driven.until_next_request();
        assert!(
            written.load(Ordering::SeqCst),
            "the turn ended with nothing pending"
        );
        drop(writer.join().expect("writer"));
    }

    #[test]
    fn a_turn_runs_the_runtime_and_ends_when_the_session_does() {
        let (driven, _rx, tx) = driven_by_pipe();
        let (sent, received) = mpsc::channel();
        driven.rt.spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let _ = sent.send(());
            // The write end closing is what an unmount is to /dev/fuse: an error to poll.
            drop(tx);
        });
        driven.until_next_request();
        received.try_recv().expect("the task ran during the turn");
    }

    /// A standby thread for `driven`; stopped and joined by `stop`.
    fn standby_of(driven: &Arc<Driven>) -> std::thread::JoinHandle<()> {
        let driven = driven.clone();
        std::thread::spawn(move || driven.stand_by())
    }

    fn stop(driven: &Driven, standby: std::thread::JoinHandle<()>) {
        driven.stop_standing_by();
        standby.join().expect("the standby stops when told");
    }

    /// Spawns a task on `driven`'s runtime from outside it and waits for it to have run.
    fn a_task_runs(driven: &Driven) {
        let (sent, received) = mpsc::channel();
        driven.rt.spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let _ = sent.send(());
        });
        received
            .recv_timeout(Duration::from_secs(30))
            .expect("nothing ran the task");
    }

    #[test]
    fn the_standby_drives_the_runtime_while_the_fuse_thread_is_away() {
        let (driven, _rx, _tx) = driven_by_pipe();
        let driven = Arc::new(driven);
        let standby = standby_of(&driven);
        a_task_runs(&driven);
        stop(&driven, standby);
    }

    #[test]
    fn a_request_that_panics_inside_the_runtime_leaves_it_to_the_standby() {
        let (driven, _rx, _tx) = driven_by_pipe();
        let driven = Arc::new(driven);
        let standby = standby_of(&driven);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            driven.answer(async { panic!("a request's answer panics") });
        }));
        assert!(panicked.is_err());
        a_task_runs(&driven);
        stop(&driven, standby);
    }

    #[test]
    fn the_standby_sleeps_while_the_fuse_thread_waits_inside_and_wakes_when_it_leaves() {
        let (driven, mut rx, mut tx) = driven_by_pipe();
        let driven = Arc::new(driven);
        let standby = standby_of(&driven);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            tx.write_all(b"x").expect("a request");
            tx
        });
        // Inside for 200 ms: the standby goes to sleep.
        driven.until_next_request();
        let mut one = [0u8; 1];
        rx.read_exact(&mut one).expect("the request");
        // Away from now on: the standby must wake and run the task.
        a_task_runs(&driven);
        stop(&driven, standby);
        drop(writer.join().expect("writer"));
    }
}
