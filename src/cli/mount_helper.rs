//! rapidfs as a mount(8) helper, and the `-o` option list.
//!
//! `mount -t fuse.rapidfs BUCKET DIR -o OPTS` runs `/sbin/mount.fuse.rapidfs BUCKET DIR -o OPTS`
//! when that name exists (a symlink to rapidfs), else `mount.fuse3`, which runs
//! `rapidfs BUCKET DIR -o OPTS` found in the default PATH. Both shapes are rewritten here into
//! `rapidfs mount BUCKET DIR -o OPTS` before clap sees them. Then every `-o` option is sorted:
//! kernel mount options stay in the list, fstab bookkeeping (`_netdev`, `noauto`, `x-*`, ...)
//! is dropped, and `name[=value]` of any `rapidfs mount` flag becomes `--name[=value]`
//! (underscores or dashes), so `uid=1000,file_mode=640,only_dir=train,nofail` work in fstab.
//! Touches nothing but argument vectors.

use std::ffi::OsString;

/// Whether `word` names a subcommand (taken from the parser itself, so a new subcommand is
/// never mistaken for a bucket): an argv whose first word is none (nor a flag) is a mount(8) call.
fn is_subcommand(word: &str) -> bool {
    use clap::CommandFactory;
    word == "help"
        || super::Cli::command()
            .get_subcommands()
            .any(|c| c.get_name() == word)
}

/// Options the kernel (or fusermount3) takes; `fuse::MountSettings` applies them.
const KERNEL: [&str; 16] = [
    "ro",
    "rw",
    "allow_other",
    "default_permissions",
    "auto_unmount",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "sync",
    "async",
    "dirsync",
];

/// Whether `name` is an option of the kernel mount rather than of rapidfs.
pub(super) fn is_kernel_option(name: &str) -> bool {
    KERNEL.contains(&name)
}

/// fstab and mount(8) bookkeeping with nothing to do once rapidfs runs.
const IGNORED: [&str; 8] = [
    "_netdev", "auto", "noauto", "user", "nouser", "users", "owner", "defaults",
];

/// What to run after looking at how we were called.
#[derive(Debug, PartialEq)]
pub enum Invocation {
    /// Parse this argv with clap.
    Argv(Vec<OsString>),
    /// `mount -f`: pretend to mount, i.e. do nothing and succeed.
    Fake,
}

/// Rewrites a mount(8) helper call (`mount.fuse.rapidfs SRC DIR [-s] [-n] [-v] [-f] [-o OPTS]
/// [-t TYPE]`, or the same with no subcommand from mount.fuse3) into `rapidfs mount SRC DIR -o
/// OPTS`; any other argv is returned as it is.
pub fn rewrite(argv: Vec<OsString>) -> Invocation {
    let called_as_helper = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n.to_string_lossy().starts_with("mount."));
    let word = |i: usize| argv.get(i).map(|a| a.to_string_lossy().into_owned());
    // mount(8) always passes an absolute mountpoint; a mistyped subcommand has none.
    let no_subcommand = word(1).is_some_and(|f| !f.starts_with('-') && !is_subcommand(&f))
        && word(2).is_some_and(|m| m.starts_with('/'));
    if !(called_as_helper || no_subcommand) {
        return Invocation::Argv(argv);
    }
    let mut out: Vec<OsString> = vec!["rapidfs".into(), "mount".into()];
    let mut rest = argv.into_iter().skip(1);
    while let Some(a) = rest.next() {
        match a.to_str() {
            Some("-o") => {
                out.push("-o".into());
                out.extend(rest.next());
            }
            Some("-t") => {
                rest.next();
            }
            // sloppy, no mtab, verbose: nothing to change for rapidfs.
            Some("-s" | "-n" | "-v") => {}
            Some("-f") => return Invocation::Fake,
            Some(s) if s.starts_with("-o") => {
                out.push("-o".into());
                out.push(s[2..].into());
            }
            _ => out.push(a),
        }
    }
    Invocation::Argv(out)
}

/// What one `-o` option means to rapidfs.
#[derive(Debug, PartialEq, Eq)]
pub enum MountOpt {
    /// A kernel mount option: stays in the `-o` list.
    Kernel,
    /// Bookkeeping of fstab or mount(8): dropped.
    Ignored,
    /// The `rapidfs mount` flag this option stands for (`--name` or `--name=value`).
    Flag(String),
}

/// Sorts one `-o` option; `is_flag(name)` says whether `--name` is a `rapidfs mount` flag.
pub fn classify(opt: &str, is_flag: impl Fn(&str) -> bool) -> Result<MountOpt, String> {
    let opt = opt.trim();
    if opt.is_empty()
        || IGNORED.contains(&opt)
        || opt.starts_with("x-")
        || opt.starts_with("comment=")
    {
        return Ok(MountOpt::Ignored);
    }
    if KERNEL.contains(&opt) {
        return Ok(MountOpt::Kernel);
    }
    let (name, value) = match opt.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (opt, None),
    };
    let name = name.replace('_', "-");
    if is_flag(&name) && !matches!(name.as_str(), "help" | "version") {
        return Ok(MountOpt::Flag(match value {
            Some(v) => format!("--{name}={v}"),
            None => format!("--{name}"),
        }));
    }
    Err(format!(
        "unknown mount option '{opt}' (-o takes mount options such as ro, allow_other, and \
         rapidfs mount flags as name=value, e.g. uid=1000)"
    ))
}

/// The `-o` lists split into single options.
pub fn split(options: &[String]) -> impl Iterator<Item = &str> {
    options.iter().flat_map(|o| o.split(',')).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn mount_fuse3_shape_becomes_the_mount_subcommand() {
        let got = rewrite(argv(&["rapidfs", "bkt", "/mnt/x", "-o", "ro,dev,suid"]));
        assert_eq!(
            got,
            Invocation::Argv(argv(&[
                "rapidfs",
                "mount",
                "bkt",
                "/mnt/x",
                "-o",
                "ro,dev,suid"
            ]))
        );
    }

    #[test]
    fn helper_name_drops_mount8_flags() {
        let got = rewrite(argv(&[
            "/sbin/mount.fuse.rapidfs",
            "bkt",
            "/mnt/x",
            "-s",
            "-n",
            "-v",
            "-o",
            "ro,nofail",
            "-t",
            "fuse.rapidfs",
        ]));
        assert_eq!(
            got,
            Invocation::Argv(argv(&[
                "rapidfs",
                "mount",
                "bkt",
                "/mnt/x",
                "-o",
                "ro,nofail"
            ]))
        );
        assert_eq!(
            rewrite(argv(&["mount.fuse.rapidfs", "b", "/m", "-f"])),
            Invocation::Fake
        );
    }

    #[test]
    fn subcommands_and_flags_are_left_alone() {
        for words in [
            &["rapidfs", "mount", "b", "/m"][..],
            &["rapidfs", "prefetch", "/mnt/data/train"],
            &["rapidfs", "--log-level", "debug", "check", "b"],
            &["rapidfs", "help"],
            &["rapidfs"],
            &["rapidfs", "mout", "b", "/m"],
            &["rapidfs", "frob"],
        ] {
            assert_eq!(rewrite(argv(words)), Invocation::Argv(argv(words)));
        }
    }

    #[test]
    fn options_are_sorted() {
        let flags = ["uid", "file-mode", "nofail", "implicit-dirs"];
        let is_flag = |n: &str| flags.contains(&n);
        let c = |o: &str| classify(o, is_flag);
        assert_eq!(c("ro"), Ok(MountOpt::Kernel));
        assert_eq!(c("allow_other"), Ok(MountOpt::Kernel));
        for o in [
            "_netdev",
            "noauto",
            "x-systemd.automount",
            "comment=x",
            "defaults",
            "",
        ] {
            assert_eq!(c(o), Ok(MountOpt::Ignored), "{o}");
        }
        assert_eq!(c("uid=1000"), Ok(MountOpt::Flag("--uid=1000".into())));
        assert_eq!(
            c("file_mode=640"),
            Ok(MountOpt::Flag("--file-mode=640".into()))
        );
        assert_eq!(c("nofail"), Ok(MountOpt::Flag("--nofail".into())));
        assert_eq!(
            c("implicit_dirs"),
            Ok(MountOpt::Flag("--implicit-dirs".into()))
        );
        let err = c("bogus=1").unwrap_err();
        assert!(err.contains("'bogus=1'"), "{err}");
    }
}
