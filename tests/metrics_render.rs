//! The Prometheus text of every kind of series the daemon records. A process of its own:
//! the series are bound to a recorder at their first use, so a test thread of another test
//! that records first would bind them to no recorder at all.

use rapidfs::metrics::{builder, cache_lookup, fuse_op, grpc_call, memory, stream, StreamEvent};
use std::time::Duration;

#[test]
fn records_render_as_prometheus_text() {
    let recorder = builder().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        fuse_op("read", Duration::from_micros(80), 4096, None);
        fuse_op("lookup", Duration::from_micros(30), 0, Some(libc::ENOENT));
        grpc_call("BidiReadObject", Duration::from_millis(2), "OK");
        stream("read", StreamEvent::Reconnected);
        cache_lookup(true, ());
        memory(5, 10);
    });
    let text = handle.render();
    for line in [
        "rapidfs_fuse_requests_total{op=\"read\"} 1",
        "rapidfs_fuse_bytes_total{op=\"read\"} 4096",
        "rapidfs_fuse_errors_total{op=\"lookup\",errno=\"ENOENT\"} 1",
        "rapidfs_grpc_calls_total{method=\"BidiReadObject\",code=\"OK\"} 1",
        "rapidfs_streams_total{kind=\"read\",event=\"reconnected\"} 1",
        "rapidfs_cache_lookups_total{result=\"hit\"} 1",
        "rapidfs_memory_budget_bytes 10",
        "rapidfs_fuse_latency_seconds_bucket{op=\"read\",le=\"0.0001\"} 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}
