//! `config/rapidfs.toml` is the annotated example of every tunable: it must parse, show the
//! defaults exactly, and name every key of `Config` (keys without a default, such as `uid`,
//! appear commented out as `# key = ...`).

use rapidfs::config::Config;
use std::collections::BTreeSet;

fn example() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/rapidfs.toml")).unwrap()
}

/// `section.key` for every key in a section, and `key` for every key above the sections.
fn keys(value: &toml::Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (section, item) in value.as_table().into_iter().flatten() {
        match item.as_table() {
            Some(table) => out.extend(table.keys().map(|key| format!("{section}.{key}"))),
            None => {
                out.insert(section.clone());
            }
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
    all.extend(["gcs.ca_file", "gcs.credentials_file", "profile"].map(String::from));
    let missing: Vec<_> = all.difference(&shown).collect();
    assert!(missing.is_empty(), "config/rapidfs.toml lacks {missing:?}");
}

/// The README's table of profiles names every key each profile sets, with its value, and
/// no key the profile does not set.
#[test]
fn readme_profile_table_says_what_each_profile_sets() {
    use rapidfs::profiles::Profile;
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for p in [
        Profile::AimlTraining,
        Profile::AimlServing,
        Profile::AimlCheckpointing,
    ] {
        let row_start = format!("| `{}` |", p.name());
        // (key, value) pairs of the README's rows: several keys in a row share its values,
        // one value each in order, or one value for all.
        let mut documented = BTreeSet::new();
        for row in readme.lines().filter(|l| l.starts_with(&row_start)) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let keys: Vec<&str> = cells[2].split(", ").map(|k| k.trim_matches('`')).collect();
            let values: Vec<&str> = cells[3].split(" (").next().unwrap().split(", ").collect();
            for (i, k) in keys.iter().enumerate() {
                let v = values.get(i).or(values.first()).unwrap();
                documented.insert(format!("{k} = {v}"));
            }
        }
        let mut set = BTreeSet::new();
        for (section, table) in p.keys() {
            for (k, v) in table.as_table().unwrap() {
                set.insert(format!("{section}.{k} = {v}"));
            }
        }
        assert_eq!(documented, set, "README's rows of {}", p.name());
    }
}
