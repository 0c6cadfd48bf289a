//! Fault and realism injection: the `Faults` settings (changeable at run time) and the
//! counters that decide which call or stream open gets a fault. Touches nothing else.

use rand::Rng;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Fault and realism injection; changeable at run time.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Delay added to every response message and unary call, in microseconds; messages keep
    /// flowing behind it (a pipeline delay, not a throughput cap).
    pub latency_us: u64,
    /// Cut (end with UNAVAILABLE) a BidiReadObject stream after it has sent this many payload bytes.
    pub cut_read_after_bytes: Option<u64>,
    /// Cut a BidiWriteObject stream after it has received this many payload bytes.
    pub cut_write_after_bytes: Option<u64>,
    /// Fail every k-th call (unary calls and stream opens) with UNAVAILABLE.
    pub unavailable_every: Option<u64>,
    /// Carry out every k-th MoveObject or DeleteObject, then answer it UNAVAILABLE: the
    /// answer lost with its connection after the change was made, which a client retries.
    pub lose_answer_every: Option<u64>,
    /// Answer every k-th bidi stream open (read and write) with ABORTED carrying a
    /// Bidi{Read,Write}ObjectRedirectedError (routing token + handle).
    pub redirect_every: Option<u64>,
    /// Chunks of random size (1 B..=2 MiB), interleaved read_ids, trailing empty chunks after range_end.
    pub chaos: bool,
    /// Refuse (FAILED_PRECONDITION) a `WriteObjectSpec` or a `MoveObject` that would replace
    /// an unfinalized appendable object, as some servers do; clients must delete it first.
    pub refuse_replace_unfinalized: bool,
    /// HTTP/2 flow-control window of every stream, in KiB (four times that for a
    /// connection), instead of the large one loopback affords: a writer then waits for
    /// capacity while answers arrive, as it does against a distant server. Read once, when
    /// the emulator starts.
    pub flow_window_kib: Option<u32>,
    /// A BidiWriteObject stream that creates its object (a `WriteObjectSpec`) stops reading
    /// and answering once more than this many payload bytes came in, and stays open until
    /// the client goes away: a service stuck mid-stream, which grants no more flow-control
    /// room. A stream that reopens an object is served, so a writer that notices finishes.
    pub stall_new_write_after_bytes: Option<u64>,
    /// A BidiWriteObject stream takes in payload no faster than this many KiB a second: a
    /// slow link. Each data message is read only once its bytes' time at this rate passed.
    pub write_kib_per_s: Option<u64>,
    /// GetObject and ListObjects report an unfinalized object's size as 0, with no checksum:
    /// the service's metadata of an appendable object can lag behind its appends, down to
    /// 0 bytes. Read streams and write answers go on reporting the size they serve.
    pub stale_unfinalized_size: bool,
    /// RenameFolder answers with an operation that is not done yet and carries the rename out
    /// this many milliseconds later, as the service does with a large folder: the source is
    /// there, the destination not, until then.
    pub rename_folder_pending_ms: Option<u64>,
    /// ListObjects puts at most this many entries (objects and prefixes) on a page, fewer
    /// than asked for, as the service may.
    pub list_page_limit: Option<u32>,
}

/// The live fault settings plus the counters that pick the k-th call.
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    faults: RwLock<Faults>,
    calls: AtomicU64,
    opens: AtomicU64,
    changes: AtomicU64,
    /// Routing tokens handed out in redirects; a reopen carrying one is not redirected again.
    tokens: Mutex<HashSet<String>>,
}

impl FaultState {
    /// Starts with `faults`.
    pub fn new(faults: Faults) -> Arc<FaultState> {
        Arc::new(FaultState {
            faults: RwLock::new(faults),
            ..FaultState::default()
        })
    }

    /// The settings now.
    pub fn get(&self) -> Faults {
        match self.faults.read() {
            Ok(f) => f.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the settings and restarts the k-th counters.
    pub fn set(&self, faults: Faults) {
        match self.faults.write() {
            Ok(mut f) => *f = faults,
            Err(poisoned) => *poisoned.into_inner() = faults,
        }
        self.calls.store(0, Ordering::Relaxed);
        self.opens.store(0, Ordering::Relaxed);
        self.changes.store(0, Ordering::Relaxed);
    }

    /// The delay to add to each message, if any.
    pub fn latency(&self) -> Option<Duration> {
        let us = self.get().latency_us;
        (us > 0).then(|| Duration::from_micros(us))
    }

    /// Counts one call; true when this one must fail with UNAVAILABLE.
    pub fn call_fails(&self) -> bool {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        matches!(self.get().unavailable_every, Some(k) if k > 0 && n.is_multiple_of(k))
    }

    /// Counts one change a unary call made; true when its answer must be lost.
    pub fn answer_lost(&self) -> bool {
        let n = self.changes.fetch_add(1, Ordering::Relaxed) + 1;
        matches!(self.get().lose_answer_every, Some(k) if k > 0 && n.is_multiple_of(k))
    }

    /// Counts one bidi stream open; returns a fresh routing token when this one must be
    /// redirected. An open that carries a token we handed out is let through.
    pub fn redirect(&self, presented_token: Option<&str>) -> Option<String> {
        let n = self.opens.fetch_add(1, Ordering::Relaxed) + 1;
        let k = self.get().redirect_every?;
        if let Some(t) = presented_token {
            if self.lock_tokens().contains(t) {
                return None;
            }
        }
        if k == 0 || !n.is_multiple_of(k) {
            return None;
        }
        let token = format!("rt-{:016x}", rand::rng().random::<u64>());
        self.lock_tokens().insert(token.clone());
        Some(token)
    }

    fn lock_tokens(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        match self.tokens.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}
