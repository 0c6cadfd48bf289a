//! The deployment files are checked offline: the systemd unit with `systemd-analyze verify`,
//! the Kubernetes manifests against the Kubernetes schemas (`kubernetes-validate --strict`),
//! and the rapidfs command lines inside both must parse with the real CLI. Each check is
//! also run on a deliberately broken copy to show that it can fail.

use clap::Parser;
use rapidfs::cli::Cli;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Writes the unit (with `edit` applied) into a temp dir as an instance and verifies it.
fn verify_unit(edit: impl Fn(String) -> String) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(repo().join("systemd/rapidfs@.service")).unwrap();
    let unit = edit(unit.replace("/usr/local/bin/rapidfs", env!("CARGO_BIN_EXE_rapidfs")));
    std::fs::write(dir.path().join("rapidfs@.service"), unit).unwrap();
    std::os::unix::fs::symlink("rapidfs@.service", dir.path().join("rapidfs@demo.service"))
        .unwrap();
    Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.path().join("rapidfs@demo.service"))
        .output()
        .expect("systemd-analyze must be installed (tests/setup.sh installs systemd)")
}

#[test]
fn systemd_unit_verifies() {
    let out = verify_unit(|u| u);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed: {stderr}"
    );
    assert!(
        !stderr.contains("rapidfs@"),
        "systemd-analyze warned: {stderr}"
    );
}

#[test]
fn systemd_check_rejects_a_broken_unit() {
    let out = verify_unit(|u| u.replace("Restart=on-failure", "Restart=sometimes"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("sometimes"), "broken unit passed: {stderr}");
}

#[test]
fn systemd_exec_start_parses_with_the_cli() {
    let unit = std::fs::read_to_string(repo().join("systemd/rapidfs@.service")).unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("unit has ExecStart");
    let argv: Vec<String> = line
        .split_whitespace()
        .map(|w| w.replace("%i", "demo-bucket"))
        .collect();
    if let Err(e) = Cli::try_parse_from(&argv) {
        panic!("ExecStart does not parse: {argv:?}: {e}");
    }
}

fn kubernetes_validate(files: &[&Path]) -> std::process::Output {
    let python = std::env::var("RAPIDFS_PYTHON")
        .expect("RAPIDFS_PYTHON is unset: run the suite with `bash tests/run.sh`");
    let validator = Path::new(&python).with_file_name("kubernetes-validate");
    Command::new(validator)
        .arg("--strict")
        .args(files)
        .output()
        .expect("kubernetes-validate runs (tests/python/requirements.txt)")
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests under k8s/");
    files
}

#[test]
fn kubernetes_manifests_validate() {
    let files = manifests();
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let out = kubernetes_validate(&refs);
    assert!(
        out.status.success(),
        "kubernetes-validate failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn kubernetes_check_rejects_a_broken_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let job = std::fs::read_to_string(repo().join("k8s/sidecar-job.yaml")).unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        job.replace(
            "mountPropagation: Bidirectional",
            "mountPropagaton: Bidirectional",
        ),
    )
    .unwrap();
    assert!(!kubernetes_validate(&[&broken]).status.success());
}

#[test]
fn kubernetes_rapidfs_args_parse_with_the_cli() {
    for file in manifests() {
        let text = std::fs::read_to_string(&file).unwrap();
        // The args list of every rapidfs container: "- mount" up to the next key.
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.trim() != "args:" {
                continue;
            }
            // The default image's entrypoint is `rapidfs gke-sidecar`: a container that runs
            // another subcommand uses the `full` image, whose entrypoint is `rapidfs`.
            let image = lines[..i]
                .iter()
                .rev()
                .find_map(|l| l.trim().strip_prefix("image: "))
                .unwrap_or("");
            assert!(
                image.ends_with("-full"),
                "{}: rapidfs args for image {image:?}, not the -full image",
                file.display()
            );
            let mut argv = vec!["rapidfs".to_string()];
            for arg in lines[i + 1..]
                .iter()
                .map_while(|a| a.trim().strip_prefix("- "))
            {
                argv.push(arg.trim_matches('"').to_string());
            }
            if let Err(e) = Cli::try_parse_from(&argv) {
                panic!("{}: args do not parse: {argv:?}: {e}", file.display());
            }
        }
    }
}

/// The image's filesystem as `docker/rootfs.sh` lays it out (the Dockerfile's last stage).
fn image_rootfs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("sh")
        .arg(repo().join("docker/rootfs.sh"))
        .arg(env!("CARGO_BIN_EXE_rapidfs"))
        .arg(dir.path())
        .output()
        .expect("sh runs");
    assert!(
        out.status.success(),
        "rootfs.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Runs the image's rapidfs inside `root` as uid/gid 65534, with nothing but what the image holds.
fn in_image(root: &Path, args: &[&str]) -> std::process::Output {
    Command::new("chroot")
        .arg("--userspec=65534:65534")
        .arg(root)
        .arg("/usr/local/bin/rapidfs")
        .args(args)
        .output()
        .expect("chroot runs (tests run as root)")
}

#[test]
fn the_image_layout_runs_rapidfs_as_65534_with_nothing_else() {
    let root = image_rootfs();
    let out = in_image(root.path(), &["--version"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("rapidfs "));
    let out = in_image(root.path(), &["gke-sidecar", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && help.contains("RAPIDFS_GKE_TMP"),
        "{help}"
    );
    assert!(
        root.path()
            .join("etc/ssl/certs/ca-certificates.crt")
            .is_file(),
        "CA certificates for https endpoints"
    );
    // The check can fail: without its C library the binary does not start.
    let libc = std::fs::read_dir(root.path().join("lib/x86_64-linux-gnu"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("libc.so"))
        .expect("libc in the image");
    std::fs::remove_file(libc.path()).unwrap();
    assert!(!in_image(root.path(), &["--version"]).status.success());
}

#[test]
fn the_dockerfile_runs_the_gke_sidecar_as_65534() {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let last_stage = text.rsplit("\nFROM ").next().unwrap();
    assert!(last_stage.starts_with("scratch"), "a minimal runtime stage");
    assert!(last_stage.contains("\nUSER 65534:65534\n"), "{last_stage}");
    assert!(last_stage.contains("docker/rootfs.sh") || text.contains("docker/rootfs.sh"));
    let entrypoint = last_stage
        .lines()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .expect("an ENTRYPOINT");
    let mut argv: Vec<String> = serde_json::from_str(entrypoint).expect("exec-form ENTRYPOINT");
    assert_eq!(
        argv[0], "/usr/local/bin/rapidfs",
        "the path rootfs.sh installs"
    );
    // The driver's webhook runs the entrypoint with these args.
    argv.push("--v=5".to_string());
    if let Err(e) = Cli::try_parse_from(&argv) {
        panic!("the sidecar's command line does not parse: {argv:?}: {e}");
    }
}

#[test]
fn the_gke_manifest_names_only_the_image_of_the_sidecar() {
    let text = std::fs::read_to_string(repo().join("k8s/gke-managed-csi.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| *l == "- name: gke-gcsfuse-sidecar")
        .expect("a container named gke-gcsfuse-sidecar");
    assert!(lines[at + 1].starts_with("image: "), "{}", lines[at + 1]);
    assert!(
        lines[at + 2].starts_with("- name: "),
        "nothing but the image: {}",
        lines[at + 2]
    );
    assert!(text.contains("gke-gcsfuse/volumes: \"true\""));
    assert!(text.contains("driver: gcsfuse.csi.storage.gke.io"));
}
