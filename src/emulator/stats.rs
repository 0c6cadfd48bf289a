//! Counters of what the emulator served, readable from tests as a snapshot. Touches nothing
//! else.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters readable from tests (a consistent-enough snapshot of atomics).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Every RPC (unary + stream opens).
    pub calls: u64,
    /// BidiReadObject streams opened (including failed/redirected opens).
    pub read_streams: u64,
    /// BidiReadObject streams that opened and have since ended (closed by either side).
    pub read_streams_ended: u64,
    /// BidiWriteObject streams opened.
    pub write_streams: u64,
    /// BidiWriteObject streams whose whole upload (the create, every byte, and the finish
    /// or half-close) had come in when the first message was read, stored in one step.
    pub whole_uploads: u64,
    /// ReadRange entries received.
    pub ranges_requested: u64,
    /// Sum of requested range lengths (a length of 0 = to the end, resolved).
    pub bytes_requested: u64,
    /// Object payload bytes sent in read responses.
    pub bytes_sent: u64,
    /// Object payload bytes received in write requests.
    pub bytes_received: u64,
    /// ListObjects calls.
    pub list_calls: u64,
    /// GetObject calls.
    pub get_object_calls: u64,
    /// Calls without a correct `x-goog-request-params` routing header.
    pub missing_routing_header: u64,
    /// Read-response messages sent (each carries at most one chunk).
    pub read_messages: u64,
    /// Streams and calls ended by an injected fault (cut, unavailable, redirect).
    pub faults_injected: u64,
    /// Unary calls and write-stream opens held back by the injected latency (read streams
    /// delay each message instead, uncounted).
    pub delays_injected: u64,
    /// Read chunks whose size and range the chaos fault picked at random.
    pub chaos_chunks: u64,
    /// Calls and stream opens carrying a bearer token the emulator accepts (see `Emulator::allow_token`).
    pub bearer_valid: u64,
    /// Calls and stream opens without an `authorization: Bearer` header.
    pub bearer_missing: u64,
    /// Calls and stream opens with an unknown or expired bearer token.
    pub bearer_invalid: u64,
}

macro_rules! counters {
    ($($field:ident),*) => {
        /// The live counters behind [`StatsSnapshot`].
        #[derive(Debug, Default)]
        pub(crate) struct Stats { $(pub $field: AtomicU64,)* }

        impl Stats {
            /// Reads every counter.
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($field: self.$field.load(Ordering::Relaxed),)* }
            }

            /// Sets every counter to zero.
            pub fn reset(&self) {
                $(self.$field.store(0, Ordering::Relaxed);)*
            }
        }
    };
}

counters!(
    calls,
    read_streams,
    read_streams_ended,
    write_streams,
    whole_uploads,
    ranges_requested,
    bytes_requested,
    bytes_sent,
    bytes_received,
    list_calls,
    get_object_calls,
    missing_routing_header,
    read_messages,
    faults_injected,
    delays_injected,
    chaos_chunks,
    bearer_valid,
    bearer_missing,
    bearer_invalid
);

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
