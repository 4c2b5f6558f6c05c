//! The commit the harness is built from, for every result's JSON (`git_rev`): its short hash, with `-dirty` when
//! tracked files had changes; `unknown` where there is no git or no repository (a source copy).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let rev = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{rev}-dirty")
            } else {
                rev
            }
        }
        None => "unknown".to_string(),
    };
    println!("cargo:rustc-env=VFABRIC_GIT_REV={rev}");
    // A new commit or a change to the index makes a new revision; a change to the sources, a dirty one.
    for sources in ["../allocator/src", "../transport/src", "../fabric/src", "src"] {
        println!("cargo:rerun-if-changed={sources}");
    }
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        for f in ["HEAD", "index"] {
            println!("cargo:rerun-if-changed={dir}/{f}");
        }
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{head}");
        }
    }
}
