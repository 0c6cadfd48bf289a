//! Profiles: named sets of configuration keys for the common ML workloads, so that a user
//! picks `--profile aiml-training` instead of tuning TTLs, warm-up and streams by hand (the
//! names are gcsfuse's). A profile only changes defaults: it lies under the TOML file, which
//! lies under the command-line flags, so every key set explicitly still wins.

use serde::{Deserialize, Serialize};

/// A named workload profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
pub enum Profile {
    /// Reading a dataset that does not change under the mount, epoch after epoch: metadata
    /// cached for as long as the mount lives, warmed up at mount, room for millions of names.
    #[serde(rename = "aiml-training")]
    #[value(name = "aiml-training")]
    AimlTraining,
    /// Loading models that do not change under the mount: metadata cached for as long as the
    /// mount lives and warmed up at mount, more streams per large file.
    #[serde(rename = "aiml-serving")]
    #[value(name = "aiml-serving")]
    AimlServing,
    /// Writing checkpoints that other nodes write and read too: names found missing are
    /// asked again at once, half the memory budget for write buffers, files finalized at
    /// their close.
    #[serde(rename = "aiml-checkpointing")]
    #[value(name = "aiml-checkpointing")]
    AimlCheckpointing,
}

/// 100 years in milliseconds: what "for as long as the mount lives" means for a TTL.
pub const FOREVER_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

impl Profile {
    /// The profile's name, as given to `--profile`.
    pub fn name(self) -> &'static str {
        match self {
            Profile::AimlTraining => "aiml-training",
            Profile::AimlServing => "aiml-serving",
            Profile::AimlCheckpointing => "aiml-checkpointing",
        }
    }

    /// The keys the profile sets, as TOML (the README's table of profiles says the same).
    pub fn keys(self) -> toml::Table {
        let forever = FOREVER_MS;
        let text = match self {
            // The dataset's names and sizes never change while it trains: no TTL ever
            // expires. A missing name keeps the default TTL, since outputs may appear.
            Profile::AimlTraining => format!(
                "[fs]\nstat_ttl_ms = {forever}\nlist_ttl_ms = {forever}\n\
                 kernel_entry_ttl_ms = {forever}\nkernel_attr_ttl_ms = {forever}\n\
                 prefetch_metadata = true\nmetadata_cache_mb = 1024\n\
                 [read]\nprefetch_dir_order = true\n"
            ),
            Profile::AimlServing => format!(
                "[fs]\nstat_ttl_ms = {forever}\nlist_ttl_ms = {forever}\n\
                 kernel_entry_ttl_ms = {forever}\nkernel_attr_ttl_ms = {forever}\n\
                 prefetch_metadata = true\n\
                 [read]\nmax_streams_per_object = 8\nstream_per_mb = 64\n\
                 prefetch_dir_order = false\n"
            ),
            // Other ranks and nodes create files the next step looks for (at once by name,
            // within a second in a directory listing, which an evaluator polls for new
            // checkpoints), and read them whole: the stat and listings of an unfinalized
            // object can lag behind its appends, a finalized object's are exact.
            Profile::AimlCheckpointing => "[fs]\nnegative_ttl_ms = 0\nlist_ttl_ms = 1000\n\
                 [read]\nprefetch_dir_order = false\n\
                 [write]\nmemory_percent = 50\nfinalize_on_close = true\n"
                .to_string(),
        };
        text.parse().unwrap_or_default()
    }
}

/// `over` laid on `under`, table by table: a key in `over` wins, sections merge.
pub fn overlay(mut under: toml::Table, over: toml::Table) -> toml::Table {
    for (key, value) in over {
        match (under.get_mut(&key), value) {
            (Some(toml::Value::Table(u)), toml::Value::Table(o)) => {
                *u = overlay(std::mem::take(u), o);
            }
            (_, value) => {
                under.insert(key, value);
            }
        }
    }
    under
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_parses_and_sets_something() {
        for p in [
            Profile::AimlTraining,
            Profile::AimlServing,
            Profile::AimlCheckpointing,
        ] {
            assert!(!p.keys().is_empty(), "{}", p.name());
        }
    }

    #[test]
    fn overlay_keeps_keys_of_both_and_the_top_wins() {
        let under: toml::Table = "[fs]\na = 1\nb = 2\n[read]\nc = 3\n".parse().unwrap();
        let over: toml::Table = "[fs]\nb = 20\n[write]\nd = 4\n".parse().unwrap();
        let got = overlay(under, over);
        let want: toml::Table = "[fs]\na = 1\nb = 20\n[read]\nc = 3\n[write]\nd = 4\n"
            .parse()
            .unwrap();
        assert_eq!(got, want);
    }
}
