//! The `rapidfs` binary: parse the command line and run the chosen subcommand.

/// mimalloc's per-thread free lists serve the many short-lived buffers of a request (its
/// future, its messages, its chunks) without glibc's arena locks and consolidation, and
/// reuse freed MiB-sized buffers instead of mapping them afresh: measured, a quarter less
/// daemon CPU per GiB read and per small file read in directory order, for some 15 MiB more
/// peak resident memory under the 128 MiB budget test.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its `mimalloc.h`; the Rust bindings name no constant
/// for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays committed before mimalloc hands it back, in milliseconds.
/// mimalloc's own default, a second, let a daemon whose buffers turn over by the hundred MiB
/// a second sit on freed memory well past its budget: the hinted-epoch test (64 MiB budget,
/// bound 128 MiB) peaked at 114-136 MiB with it, 103-113 with 100 ms. Shorter delays purge
/// pages about to be reused: at 1 ms a 1 GiB read cost the daemon half as much CPU again.
const PURGE_DELAY_MS: std::ffi::c_long = 100;

fn main() -> std::process::ExitCode {
    // The environment's MIMALLOC_PURGE_DELAY, read by mimalloc itself, wins.
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options, which it reads atomically when it next
        // considers purging; no memory is touched.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
    rapidfs::cli::main()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // mimalloc v3 (what libmimalloc-sys builds) defaults the purge delay to a second, and
        // no other option to 1000: a renumbered option list fails here, not in production.
        // SAFETY: reads one option.
        let ms = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(ms, 1000);
    }
}
