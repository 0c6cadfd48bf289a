//! Real checkpoint writers through a real mount, each followed by a SIGKILL of the daemon:
//! `torch.save`, `torch.distributed.checkpoint` (files written from threads, fsynced, and
//! `.metadata` renamed into place), `safetensors.torch.save_file`, a Hugging Face style
//! sharded save (safetensors shards plus an index JSON), and PyTorch Lightning's
//! `ModelCheckpoint` in a real `Trainer.fit` (old checkpoints deleted, `last.ckpt` a symlink). Once the writer has returned, the
//! daemon is killed; a new daemon on a new mountpoint must load every tensor back equal.
//! Needs the interpreter tests/setup.sh prepares (RAPIDFS_PYTHON); fails loudly without it.

mod daemon_support;
mod mount_support;

use daemon_support::{daemon, kill};
use mount_support::Env;
use std::process::Command;

const BUCKET: &str = "ckpt";

/// Tensors every writer saves: a few shapes and dtypes, 40 MiB in all, seeded.
const STATE: &str = r#"
import os, sys, torch
torch.manual_seed(7)
state = {
    "embed.weight": torch.randn(2048, 2048),
    "layer.0.weight": torch.randn(1024, 1024).to(torch.bfloat16),
    "layer.0.bias": torch.randn(1024),
    "step": torch.tensor([1234], dtype=torch.int64),
}
root = os.environ["MNT"]
def same(a, b):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
"#;

/// Runs `STATE` then `script` with the mount in `$MNT`; it must print "ok".
fn run(script: &str, mnt: &std::path::Path) {
    let python = std::env::var("RAPIDFS_PYTHON").unwrap_or_else(|_| {
        panic!("RAPIDFS_PYTHON is not set: run `source tests/setup.sh` (tests/run.sh does)")
    });
    let out = Command::new(python)
        .args(["-c", &format!("{STATE}\n{script}\nprint('ok')")])
        .env("MNT", mnt)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim().ends_with("ok"),
        "python failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `save` through one daemon, SIGKILL it once the writer returned, then `load` through a new
/// daemon on a new mountpoint.
fn save_kill_load(save: &str, load: &str) {
    let env = Env::new(BUCKET);
    let endpoint = env.emu().endpoint();
    let first = tempfile::tempdir().expect("tempdir");
    let writer = daemon(&endpoint, BUCKET, first.path(), &[]);
    run(save, first.path());
    kill(writer);
    let second = tempfile::tempdir().expect("tempdir");
    let reader = daemon(&endpoint, BUCKET, second.path(), &[]);
    run(load, second.path());
    kill(reader);
}

#[test]
fn torch_save_then_load_after_a_daemon_kill() {
    save_kill_load(
        r#"torch.save(state, os.path.join(root, "model.pt"))"#,
        r#"same(state, torch.load(os.path.join(root, "model.pt")))"#,
    );
}

/// Saving `last.pt` every epoch: the second `torch.save` opens the first one's file
/// write-only with O_TRUNC and streams over it.
#[test]
fn torch_save_over_last_epochs_file_then_load_after_a_daemon_kill() {
    save_kill_load(
        r#"
path = os.path.join(root, "last.pt")
torch.save({k: v * 0 for k, v in state.items()}, path)
torch.save(state, path)
same(state, torch.load(path))
"#,
        r#"same(state, torch.load(os.path.join(root, "last.pt")))"#,
    );
}

#[test]
fn distributed_checkpoint_save_then_load_after_a_daemon_kill() {
    save_kill_load(
        r#"
import torch.distributed.checkpoint as dcp
dcp.save(state, storage_writer=dcp.FileSystemWriter(os.path.join(root, "dcp"), thread_count=4))
"#,
        r#"
import torch.distributed.checkpoint as dcp
loaded = {k: torch.zeros_like(v) for k, v in state.items()}
dcp.load(loaded, storage_reader=dcp.FileSystemReader(os.path.join(root, "dcp")))
same(state, loaded)
assert os.path.exists(os.path.join(root, "dcp", ".metadata"))
"#,
    );
}

#[test]
fn safetensors_and_a_sharded_save_then_load_after_a_daemon_kill() {
    save_kill_load(
        r#"
import json
from safetensors.torch import save_file
save_file(state, os.path.join(root, "model.safetensors"))
os.makedirs(os.path.join(root, "sharded"))
names = sorted(state)
shards = [names[:2], names[2:]]
index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
         "weight_map": {}}
for i, keys in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file({k: state[k] for k in keys}, os.path.join(root, "sharded", file))
    index["weight_map"].update({k: file for k in keys})
with open(os.path.join(root, "sharded", "model.safetensors.index.json"), "w") as f:
    json.dump(index, f)
"#,
        r#"
import json
from safetensors.torch import load_file
same(state, load_file(os.path.join(root, "model.safetensors")))
with open(os.path.join(root, "sharded", "model.safetensors.index.json")) as f:
    index = json.load(f)
loaded = {}
for file in sorted(set(index["weight_map"].values())):
    loaded.update(load_file(os.path.join(root, "sharded", file)))
same(state, loaded)
"#,
    );
}

/// A short real `Trainer.fit` on the CPU with `ModelCheckpoint(save_top_k=2,
/// save_last="link")`: full-batch gradient descent on a convex loss, so every epoch's loss is
/// lower than the one before and the top two are the last two epochs. Lightning falls back to
/// copying when `os.symlink` fails, so the checks insist on a real link.
const LIGHTNING_FIT: &str = r#"
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

torch.manual_seed(0)
x = torch.randn(64, 8)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64)
ckpt = os.path.join(root, "ckpt")
cb = ModelCheckpoint(dirpath=ckpt, filename="{epoch}", save_top_k=2, monitor="train_loss",
                     mode="min", save_last="link")
model = Tiny()
trainer = L.Trainer(max_epochs=4, accelerator="cpu", devices=1, logger=False,
                    enable_progress_bar=False, enable_model_summary=False, callbacks=[cb])
trainer.fit(model, data)
assert sorted(os.path.basename(p) for p in cb.best_k_models) == ["epoch=2.ckpt", "epoch=3.ckpt"]
torch.save(model.state_dict(), os.path.join(root, "expected.pt"))
"#;

/// What must hold after the fit, on the mount that ran it and on a new one after a SIGKILL:
/// the two best checkpoints only, `last.ckpt` a link to the newest, and the weights loaded
/// through the link equal to the trained model's.
const LIGHTNING_CHECK: &str = r#"
ckpt = os.path.join(root, "ckpt")
assert sorted(os.listdir(ckpt)) == ["epoch=2.ckpt", "epoch=3.ckpt", "last.ckpt"], os.listdir(ckpt)
last = os.path.join(ckpt, "last.ckpt")
assert os.path.islink(last), "last.ckpt is a copy, not a link"
assert os.readlink(last) == "epoch=3.ckpt", os.readlink(last)
assert os.path.realpath(last) == os.path.realpath(os.path.join(ckpt, "epoch=3.ckpt"))
expected = torch.load(os.path.join(root, "expected.pt"))
through_link = torch.load(last, weights_only=False)["state_dict"]
same(expected, through_link)
assert torch.load(last, weights_only=False)["epoch"] == 3
same(through_link, torch.load(os.path.join(ckpt, "epoch=3.ckpt"), weights_only=False)["state_dict"])
"#;

#[test]
fn lightning_model_checkpoint_links_last_and_keeps_the_top_two_after_a_daemon_kill() {
    save_kill_load(
        &format!("{LIGHTNING_FIT}\n{LIGHTNING_CHECK}"),
        LIGHTNING_CHECK,
    );
}
