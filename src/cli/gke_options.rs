//! The mount options that GKE's Cloud Storage FUSE CSI driver hands its sidecar, gcsfuse's
//! words (flags such as `uid=1000`, config keys such as `metadata-cache:ttl-secs:60`), mapped
//! onto a rapidfs [`Config`]. Each option has a meaning here, or is accepted without effect
//! (one log line saying why), or is refused. A refusal starts with "Incorrect Usage", the
//! words the driver looks for in the error file to report a bad argument rather than an
//! internal error.

use crate::config::Config;
// gcsfuse's TTL of -1, "trust forever", becomes the profiles' forever.
use crate::profiles::FOREVER_MS;

/// gcsfuse flags the sidecar sets itself; the driver refuses them from users too.
const SET_BY_SIDECAR: [&str; 10] = [
    "temp-dir",
    "config-file",
    "foreground",
    "log-file",
    "key-file",
    "token-url",
    "reuse-token-from-url",
    "cache-dir",
    "prometheus-port",
    "o",
];

/// gcsfuse flags that rapidfs accepts without effect, and why.
const NO_EFFECT: [(&str, &str); 25] = [
    ("app-name", "rapidfs sends no application name"),
    (
        "rename-dir-limit",
        "rapidfs renames a directory of any size with one RenameFolder call",
    ),
    (
        "max-conns-per-host",
        "rapidfs sizes its gRPC connections itself",
    ),
    ("sequential-read-size-mb", "rapidfs sizes its reads itself"),
    ("limit-ops-per-sec", "rapidfs does not throttle"),
    ("limit-bytes-per-sec", "rapidfs does not throttle"),
    ("max-retry-sleep", "retries follow rapidfs's own backoff"),
    ("client-protocol", "rapidfs always speaks gRPC"),
    ("http-client-timeout", "rapidfs speaks gRPC, not HTTP"),
    ("stat-cache-ttl", "use metadata-cache:ttl-secs"),
    ("type-cache-ttl", "use metadata-cache:ttl-secs"),
    (
        "stat-cache-capacity",
        "rapidfs sizes its metadata caches itself",
    ),
    (
        "kernel-list-cache-ttl-secs",
        "listings follow metadata-cache:ttl-secs",
    ),
    (
        "enable-nonexistent-type-cache",
        "rapidfs always caches missing names briefly",
    ),
    (
        "enable-hns",
        "rapidfs finds out whether the bucket has folders",
    ),
    (
        "enable-clooud-profiler-for-sidecar",
        "rapidfs has no Cloud Profiler agent",
    ),
    (
        "disable-autoconfig",
        "rapidfs does not tune itself per machine type",
    ),
    ("debug_fuse", "use logging:severity:trace"),
    ("debug_fuse_errors", "use logging:severity:trace"),
    ("debug_gcs", "use logging:severity:trace"),
    ("debug_fs", "use logging:severity:trace"),
    ("debug_http", "use logging:severity:trace"),
    ("debug_invariants", "use logging:severity:trace"),
    ("debug_mutex", "use logging:severity:trace"),
    ("log-format", "rapidfs logs JSON lines to stdout"),
];

/// gcsfuse flags that name one of its config keys, handled as that key.
const FLAG_KEYS: [(&str, &str); 8] = [
    ("metadata-cache-ttl-secs", "metadata-cache:ttl-secs"),
    (
        "metadata-cache-negative-ttl-secs",
        "metadata-cache:negative-ttl-secs",
    ),
    ("log-severity", "logging:severity"),
    (
        "stat-cache-max-size-mb",
        "metadata-cache:stat-cache-max-size-mb",
    ),
    (
        "type-cache-max-size-mb",
        "metadata-cache:type-cache-max-size-mb",
    ),
    ("file-cache-max-size-mb", "file-cache:max-size-mb"),
    (
        "file-cache-cache-file-for-range-read",
        "file-cache:cache-file-for-range-read",
    ),
    (
        "file-cache-enable-parallel-downloads",
        "file-cache:enable-parallel-downloads",
    ),
];

/// Options rapidfs cannot honour, and why: better a clear refusal than a mount that fails
/// later in a way nobody connects to the option.
const REFUSED: [(&str, &str); 2] = [
    (
        "token-server-identity-provider",
        "rapidfs takes credentials from the metadata server only; the host-network token server is not supported",
    ),
    (
        "hnw-ksa",
        "rapidfs takes credentials from the metadata server only; the host-network token server is not supported",
    ),
];

/// The gcsfuse flags that take true/false or nothing.
const BOOL_FLAGS: [&str; 11] = [
    "implicit-dirs",
    "debug_fuse_errors",
    "enable-nonexistent-type-cache",
    "enable-hns",
    "debug_fuse",
    "debug_gcs",
    "debug_fs",
    "debug_http",
    "debug_invariants",
    "debug_mutex",
    "disable-autoconfig",
];

/// Sections of gcsfuse's config file whose keys rapidfs accepts without effect, and why;
/// the keys that do mean something are matched before these.
const NO_EFFECT_SECTIONS: [(&str, &str); 12] = [
    (
        "file-cache",
        "rapidfs keeps no file cache on disk: reads are served from its memory budget",
    ),
    ("metadata-cache", "rapidfs sizes its metadata caches itself"),
    (
        "gcs-connection",
        "rapidfs sizes its gRPC connections itself",
    ),
    ("gcs-retries", "retries follow rapidfs's own backoff"),
    (
        "gcs-auth",
        "credentials come from the metadata server (Workload Identity)",
    ),
    ("file-system", "not a setting rapidfs has"),
    ("logging", "rapidfs logs JSON lines to stdout"),
    (
        "write",
        "rapidfs streams every write to an appendable object",
    ),
    ("read", "rapidfs sizes its reads itself"),
    ("list", "rapidfs lists as it needs"),
    ("metrics", "metrics are served on the volume's metrics.sock"),
    ("debug", "use logging:severity:trace"),
];

/// What one volume's options mean besides the config they change.
#[derive(Debug, PartialEq)]
pub struct Applied {
    /// The log level asked for with `logging:severity:`, in tracing's words.
    pub log_level: Option<String>,
    /// Whether this volume's `metrics.sock` is served (on unless the driver turns it off).
    pub metrics: bool,
    /// One line per option accepted without effect, saying why.
    pub ignored: Vec<String>,
}

/// What an option did.
enum Effect {
    Applied,
    Ignored(&'static str),
}

/// An option as gcsfuse reads it: a flag (`name`, `name=value`) or a config key
/// (`section:key:value`).
enum Opt<'a> {
    Flag(&'a str, Option<&'a str>),
    Key(&'a str, &'a str),
}

fn parse(opt: &str) -> Opt<'_> {
    // A flag's value may hold colons (`custom-endpoint=http://host:1`): only the name, before
    // the first `=`, tells a flag from a key.
    match opt.split_once('=') {
        Some((name, value)) if !name.contains(':') => Opt::Flag(name, Some(value)),
        _ => match opt.rsplit_once(':') {
            Some((key, value)) => Opt::Key(key, value),
            None => Opt::Flag(opt, None),
        },
    }
}

/// Applies `options` to `cfg`. Every refused option is named in the error, not only the first.
pub fn apply(options: &[String], cfg: &mut Config) -> Result<Applied, String> {
    let mut applied = Applied {
        log_level: None,
        metrics: true,
        ignored: Vec::new(),
    };
    let mut refused = Vec::new();
    let mut negative_ttl_given = false;
    for opt in options.iter().filter(|o| !o.is_empty()) {
        let outcome = match parse(opt) {
            Opt::Flag(name, Some(value)) if flag_key(name).is_some() => {
                let key = flag_key(name).unwrap_or(name);
                negative_ttl_given |= key == "metadata-cache:negative-ttl-secs";
                config_key(key, value, cfg, &mut applied)
            }
            Opt::Flag(name, value) => flag(name, value, cfg),
            Opt::Key(key, value) => {
                negative_ttl_given |= key == "metadata-cache:negative-ttl-secs";
                config_key(key, value, cfg, &mut applied)
            }
        };
        match outcome {
            Ok(Effect::Applied) => {}
            Ok(Effect::Ignored(why)) => applied.ignored.push(format!("{opt}: {why}")),
            Err(e) => refused.push(e),
        }
    }
    if !negative_ttl_given {
        // A missing name is not trusted longer than anything else.
        cfg.fs.negative_ttl_ms = cfg.fs.negative_ttl_ms.min(cfg.fs.stat_ttl_ms);
    }
    if refused.is_empty() {
        Ok(applied)
    } else {
        Err(format!("Incorrect Usage: {}", refused.join("; ")))
    }
}

fn flag(name: &str, value: Option<&str>, cfg: &mut Config) -> Result<Effect, String> {
    if BOOL_FLAGS.contains(&name) && !matches!(value, None | Some("true" | "false")) {
        return Err(format!(
            "invalid value for flag {name}: must be true or false"
        ));
    }
    let fs = &mut cfg.fs;
    match (name, value) {
        ("implicit-dirs", None | Some("true")) => Ok(Effect::Applied),
        ("implicit-dirs", Some(_)) => Ok(Effect::Ignored(
            "rapidfs always shows directories implied by object names",
        )),
        ("ro", None) => {
            fs.read_only = true;
            Ok(Effect::Applied)
        }
        ("only-dir", Some(dir)) => {
            let dir = dir.trim_matches('/');
            fs.only_dir = (!dir.is_empty()).then(|| dir.to_string());
            Ok(Effect::Applied)
        }
        ("uid", Some(v)) => {
            fs.uid = owner(name, v)?;
            Ok(Effect::Applied)
        }
        ("gid", Some(v)) => {
            fs.gid = owner(name, v)?;
            Ok(Effect::Applied)
        }
        ("file-mode", Some(v)) => {
            fs.file_mode = mode(name, v)?;
            Ok(Effect::Applied)
        }
        ("dir-mode", Some(v)) => {
            fs.dir_mode = mode(name, v)?;
            Ok(Effect::Applied)
        }
        ("custom-endpoint", Some(url)) => {
            cfg.gcs.endpoint = url.to_string();
            Ok(Effect::Applied)
        }
        ("ro", Some(v)) => {
            fs.read_only = boolean(name, v)?;
            Ok(Effect::Applied)
        }
        (name, _) if REFUSED.iter().any(|(n, _)| *n == name) => Err(format!(
            "{name}: {}",
            REFUSED
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("", |(_, why)| *why)
        )),
        (name, _) if super::mount_helper::is_kernel_option(name) => {
            // The node server applied it when it mounted /dev/fuse.
            Ok(Effect::Ignored("the node applied it when it mounted"))
        }
        (name, _) if SET_BY_SIDECAR.contains(&name) => {
            Ok(Effect::Ignored("the sidecar sets this itself"))
        }
        (name, _) => match NO_EFFECT.iter().find(|(n, _)| *n == name) {
            Some((_, why)) => Ok(Effect::Ignored(why)),
            None if value.is_none() && needs_value(name) => {
                Err(format!("flag {name} needs a value"))
            }
            None => Err(format!("unknown flag: --{name}")),
        },
    }
}

/// The config key a gcsfuse flag stands for, when it stands for one.
fn flag_key(name: &str) -> Option<&'static str> {
    FLAG_KEYS.iter().find(|(f, _)| *f == name).map(|(_, k)| *k)
}

/// Flags that mean something only with a value.
fn needs_value(name: &str) -> bool {
    matches!(
        name,
        "only-dir" | "uid" | "gid" | "file-mode" | "dir-mode" | "custom-endpoint"
    )
}

fn config_key(
    key: &str,
    value: &str,
    cfg: &mut Config,
    applied: &mut Applied,
) -> Result<Effect, String> {
    let fs = &mut cfg.fs;
    match key {
        "metadata-cache:ttl-secs" => {
            let ms = ttl_ms(key, value)?;
            fs.stat_ttl_ms = ms;
            fs.list_ttl_ms = ms;
            fs.kernel_entry_ttl_ms = ms;
            fs.kernel_attr_ttl_ms = ms;
        }
        "metadata-cache:negative-ttl-secs" => fs.negative_ttl_ms = ttl_ms(key, value)?,
        "logging:severity" => applied.log_level = Some(severity(value)?.to_string()),
        "file-system:uid" => fs.uid = owner(key, value)?,
        "file-system:gid" => fs.gid = owner(key, value)?,
        "file-system:file-mode" => fs.file_mode = mode(key, value)?,
        "file-system:dir-mode" => fs.dir_mode = mode(key, value)?,
        "disable-metrics-for-gke" => applied.metrics = !boolean(key, value)?,
        "enable-metrics-for-gke" => applied.metrics = boolean(key, value)?,
        _ => {
            let section = key.split(':').next().unwrap_or(key);
            return match NO_EFFECT_SECTIONS.iter().find(|(s, _)| *s == section) {
                Some((_, why)) if key.contains(':') => Ok(Effect::Ignored(why)),
                _ => Err(format!("unknown flag: {key}")),
            };
        }
    }
    Ok(Effect::Applied)
}

/// A uid or gid; gcsfuse's -1 means "whoever runs the daemon".
fn owner(name: &str, v: &str) -> Result<Option<u32>, String> {
    if v == "-1" {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|_| format!("invalid value for flag {name}: '{v}' is not a number"))
}

/// Permission bits in octal, as gcsfuse takes them (`664`, `0775`).
fn mode(name: &str, v: &str) -> Result<u32, String> {
    match u32::from_str_radix(v, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!(
            "invalid value for flag {name}: '{v}' is not an octal mode"
        )),
    }
}

/// Seconds as milliseconds; a negative number means forever.
fn ttl_ms(name: &str, v: &str) -> Result<u64, String> {
    match v.parse::<i64>() {
        Ok(s) if s < 0 => Ok(FOREVER_MS),
        Ok(s) => Ok(u64::try_from(s)
            .unwrap_or(0)
            .saturating_mul(1000)
            .min(FOREVER_MS)),
        Err(_) => Err(format!(
            "invalid value for flag {name}: '{v}' is not a number of seconds"
        )),
    }
}

fn boolean(name: &str, v: &str) -> Result<bool, String> {
    v.parse()
        .map_err(|_| format!("invalid value for flag {name}: must be true or false"))
}

/// gcsfuse's severity in tracing's words.
fn severity(v: &str) -> Result<&'static str, String> {
    Ok(match v.to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" => "error",
        "off" => "off",
        _ => {
            return Err(format!(
                "invalid value for flag logging:severity: '{v}' (trace, debug, info, warning, error, off)"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_options_the_driver_sends_for_an_fs_group_set_owner_and_modes() {
        let mut cfg = Config::default();
        let applied = apply(
            &opts(&[
                "dir-mode=775",
                "file-mode=664",
                "gid=3000",
                "implicit-dirs",
                "only-dir=train/",
                "uid=1000",
            ]),
            &mut cfg,
        )
        .expect("accepted");
        assert_eq!((cfg.fs.uid, cfg.fs.gid), (Some(1000), Some(3000)));
        assert_eq!((cfg.fs.file_mode, cfg.fs.dir_mode), (0o664, 0o775));
        assert_eq!(cfg.fs.only_dir.as_deref(), Some("train"));
        assert!(applied.ignored.is_empty(), "{:?}", applied.ignored);
        assert!(applied.metrics);
    }

    #[test]
    fn config_keys_set_ttls_and_severity_and_unsupported_ones_are_ignored_with_a_reason() {
        let mut cfg = Config::default();
        let applied = apply(
            &opts(&[
                "file-cache:max-size-mb:-1",
                "logging:severity:warning",
                "metadata-cache:stat-cache-max-size-mb:32",
                "metadata-cache:ttl-secs:-1",
                "rename-dir-limit=100",
                "nodev",
            ]),
            &mut cfg,
        )
        .expect("accepted");
        assert_eq!(cfg.fs.stat_ttl_ms, FOREVER_MS);
        assert_eq!(cfg.fs.list_ttl_ms, FOREVER_MS);
        assert_eq!(cfg.fs.kernel_entry_ttl_ms, FOREVER_MS);
        assert_eq!(applied.log_level.as_deref(), Some("warn"));
        assert_eq!(applied.ignored.len(), 4, "{:?}", applied.ignored);
        assert!(applied.ignored[0].starts_with("file-cache:max-size-mb:-1: "));

        let mut cfg = Config::default();
        apply(&opts(&["metadata-cache:ttl-secs:60"]), &mut cfg).expect("accepted");
        assert_eq!(cfg.fs.stat_ttl_ms, 60_000);
        assert!(cfg.fs.negative_ttl_ms <= 60_000);
    }

    #[test]
    fn every_boolean_flag_and_the_flag_forms_of_config_keys_are_accepted() {
        for name in BOOL_FLAGS {
            let mut cfg = Config::default();
            let opts = opts(&[name, &format!("{name}=false")]);
            assert!(apply(&opts, &mut cfg).is_ok(), "{name}");
        }
        let mut cfg = Config::default();
        let applied = apply(
            &opts(&[
                "log-severity=debug",
                "metadata-cache-negative-ttl-secs=30",
                "metadata-cache-ttl-secs=600",
                "stat-cache-max-size-mb=64",
            ]),
            &mut cfg,
        )
        .expect("accepted");
        assert_eq!(applied.log_level.as_deref(), Some("debug"));
        assert_eq!(cfg.fs.stat_ttl_ms, 600_000);
        assert_eq!(cfg.fs.negative_ttl_ms, 30_000, "given, so not clamped");
        assert_eq!(applied.ignored.len(), 1, "{:?}", applied.ignored);
    }

    #[test]
    fn the_host_network_token_server_is_refused_clearly() {
        let mut cfg = Config::default();
        let err = apply(&opts(&["hnw-ksa=true"]), &mut cfg).expect_err("refused");
        assert!(err.contains("token server"), "{err}");
    }

    #[test]
    fn a_flag_value_may_hold_colons() {
        let mut cfg = Config::default();
        apply(&opts(&["custom-endpoint=http://127.0.0.1:9000"]), &mut cfg).expect("accepted");
        assert_eq!(cfg.gcs.endpoint, "http://127.0.0.1:9000");
    }

    #[test]
    fn metrics_follow_the_driver() {
        let mut cfg = Config::default();
        let off = apply(&opts(&["disable-metrics-for-gke:true"]), &mut cfg).expect("ok");
        assert!(!off.metrics);
        let off = apply(&opts(&["enable-metrics-for-gke:false"]), &mut cfg).expect("ok");
        assert!(!off.metrics);
    }

    #[test]
    fn bad_options_are_all_named_as_incorrect_usage() {
        let mut cfg = Config::default();
        let err = apply(
            &opts(&[
                "uid=alice",
                "no-such-flag",
                "file-mode=999",
                "nosuchsection:key:1",
                "implicit-dirs=maybe",
                "logging:severity:loud",
            ]),
            &mut cfg,
        )
        .expect_err("refused");
        assert!(err.starts_with("Incorrect Usage: "), "{err}");
        for part in [
            "uid",
            "unknown flag: --no-such-flag",
            "file-mode",
            "unknown flag: nosuchsection:key",
            "implicit-dirs",
            "loud",
        ] {
            assert!(err.contains(part), "{part} missing from {err}");
        }
        assert_eq!(err.lines().count(), 1);
    }
}
