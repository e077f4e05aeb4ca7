//! Embeds the preload library in the CLI, for installs that copy only the executable
//! (`cargo install --path tools`; the Python wheel ships the file too, from here).
//!
//! With the `embed-shim` feature (default) and a release build (or `GPUMEMTRACE_EMBED_SHIM=1`),
//! this builds the workspace's root package, `libgpumemtrace.so`, with a cargo of its own in a
//! target directory of its own (the outer build holds its own), copies it into `OUT_DIR` and
//! sets `cfg(gpumemtrace_embedded_shim)`; `src/shim.rs` then includes its bytes and writes them
//! into the user's cache when no library lies where the CLI looks first. Debug builds (the
//! tests, `cargo build --workspace`) skip all this: there the library is built next to the CLI.
//! `GPUMEMTRACE_EMBED_SHIM=0` skips it in release builds too.

use std::env;
use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(gpumemtrace_embedded_shim)");
    println!("cargo::rerun-if-env-changed=GPUMEMTRACE_EMBED_SHIM");
    println!("cargo::rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_EMBED_SHIM").is_none() {
        return;
    }
    let release = env::var("PROFILE").as_deref() == Ok("release");
    match env::var("GPUMEMTRACE_EMBED_SHIM").as_deref() {
        Ok("0") => return,
        Ok("1") => {}
        _ if !release => return,
        _ => {}
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().expect("tools/ lies in the workspace");
    assert!(
        root.join("src/lib.rs").is_file(),
        "the preload library's sources ({}) are not here, as in maturin's sdist, which keeps only \
         the CLI's crates: build from a checkout (pip install ., cargo install --path tools), or \
         set GPUMEMTRACE_EMBED_SHIM=0 and install libgpumemtrace.so yourself",
        root.join("src").display()
    );
    for p in [
        "src",
        "format/src",
        "format/Cargo.toml",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo::rerun-if-changed={}", root.join(p).display());
    }
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let target_dir = shim_target_dir(&out_dir);

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .args(["--package", "gpumemtrace", "--lib"])
        .arg("--target-dir")
        .arg(&target_dir);
    let target = env::var("TARGET").unwrap();
    let cross = env::var("HOST").ok().as_deref() != Some(target.as_str());
    if cross {
        cmd.args(["--target", &target]);
    }
    let profile_env = if release {
        cmd.arg("--release");
        "RELEASE"
    } else {
        "DEV"
    };
    // What the traced process needs is code and unwind tables (.eh_frame), not line tables:
    // 1.4 MB instead of 18.
    cmd.env(format!("CARGO_PROFILE_{profile_env}_DEBUG"), "false")
        .env(format!("CARGO_PROFILE_{profile_env}_STRIP"), "debuginfo");
    // What cargo told this script about this package, and clippy's wrapper, are not for the
    // nested build; the compiler, its wrapper, the flags and the jobserver are.
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
            || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || k.starts_with("DEP_")
            || [
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_DIR",
                "CARGO_BUILD_TARGET_DIR",
                "OUT_DIR",
                "RUSTC_WORKSPACE_WRAPPER",
            ]
            .contains(&k.as_ref())
        {
            cmd.env_remove(k.as_ref());
        }
    }
    // Cargo reads this script's stdout for instructions: the nested cargo's goes to stderr.
    cmd.stdout(Stdio::from(std::io::stderr()));
    let status = cmd
        .status()
        .expect("running cargo to build the preload library");
    assert!(
        status.success(),
        "building the preload library (the root package, gpumemtrace) for embedding failed: {status}"
    );

    let mut built = target_dir;
    if cross {
        built.push(&target);
    }
    built.push(if release { "release" } else { "debug" });
    built.push("libgpumemtrace.so");
    let bytes = std::fs::read(&built).unwrap_or_else(|e| panic!("{}: {e}", built.display()));
    std::fs::write(out_dir.join("libgpumemtrace.so"), &bytes).unwrap();
    // Content-addressed: two builds share a cached copy only when their bytes are equal (the
    // CLI compares them before using one anyway).
    println!(
        "cargo::rustc-env=GPUMEMTRACE_EMBEDDED_SHIM_NAME=libgpumemtrace-{}.so",
        content_hash(&bytes)
    );
    println!("cargo::rustc-cfg=gpumemtrace_embedded_shim");
}

/// One target directory for the nested builds of every profile and feature set, beside the
/// outer one (`<target>/gpumemtrace-shim`), so that it is built once, not once per `OUT_DIR`.
fn shim_target_dir(out_dir: &Path) -> PathBuf {
    // OUT_DIR is <target>[/<triple>]/<profile>/build/<package>-<hash>/out.
    let a: Vec<&Path> = out_dir.ancestors().take(5).collect();
    match a.as_slice() {
        [out, _, build, _, target] if out.ends_with("out") && build.ends_with("build") => {
            target.join("gpumemtrace-shim")
        }
        _ => out_dir.join("shim-target"),
    }
}

/// 128 bits of two SipHash passes (std's fixed-key hasher: equal in every build script run
/// by the same compiler, which is all a name chosen here needs), as hex.
fn content_hash(bytes: &[u8]) -> String {
    let mut out = String::new();
    for salt in [0u8, 1] {
        let mut h = DefaultHasher::new();
        h.write_u8(salt);
        h.write(bytes);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}
