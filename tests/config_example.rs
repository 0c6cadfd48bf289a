//! `config/rapidfs.toml` is the annotated example of every tunable: it must parse, show the
//! defaults exactly, and name every key of `Config` (keys without a default, such as `uid`,
//! appear commented out as `# key = ...`).

use rapidfs::config::Config;
use std::collections::BTreeSet;

fn example() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/rapidfs.toml")).unwrap()
}

/// `section.key` for every key in a TOML table of tables.
fn keys(value: &toml::Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (section, table) in value.as_table().into_iter().flatten() {
        for key in table.as_table().into_iter().flat_map(|t| t.keys()) {
            out.insert(format!("{section}.{key}"));
        }
    }
    out
}

#[test]
fn example_parses_to_the_defaults() {
    let parsed = Config::parse(&example()).unwrap_or_else(|e| panic!("config/rapidfs.toml: {e}"));
    assert_eq!(
        parsed,
        Config::default(),
        "config/rapidfs.toml must show the defaults; they are:\n{}",
        toml::to_string(&Config::default()).unwrap()
    );
}

#[test]
fn example_names_every_key() {
    let text = example();
    let uncommented: String = text
        .lines()
        .map(|l| {
            l.strip_prefix("# ")
                .filter(|r| r.contains(" = "))
                .unwrap_or(l)
        })
        .collect::<Vec<_>>()
        .join("\n");
    let shown = keys(&toml::from_str(&uncommented).expect("commented keys are valid TOML"));
    let mut all = keys(&toml::Value::try_from(Config::default()).unwrap());
    // Optional keys have no default to serialize; name them here so they are not forgotten.
    all.extend(["fs.uid", "fs.gid", "fs.only_dir"].map(String::from));
    all.extend(["gcs.ca_file", "gcs.credentials_file"].map(String::from));
    let missing: Vec<_> = all.difference(&shown).collect();
    assert!(missing.is_empty(), "config/rapidfs.toml lacks {missing:?}");
}
