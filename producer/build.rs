//! Links `gma-agent` with the code it runs placed together: `gma-agent.order` (written by
//! scripts/agent-order.sh) lists those functions, most called first, and LLD puts them at the
//! start of the executable's text (`--symbol-ordering-file`). The agent then runs ≈ 1 MiB of one
//! place instead of pages strewn over its 4.6 MiB of code, and about 2 MiB fewer of its pages
//! are resident (docs/PERFORMANCE.md, "The agent's code in one place").
//!
//! Only where the linker is known to be LLD: rustc's own, the default for
//! x86_64-unknown-linux-gnu since Rust 1.90, unless a linker is chosen. The names are the
//! `agent` profile's; in other profiles, or after a toolchain or dependency change, names the
//! executable lacks are skipped by the linker (`--no-warn-symbol-ordering`): the build is the
//! same, only the placement is lost (scripts/build-deb.sh reports how much of it is left).

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=gma-agent.order");
    println!("cargo:rerun-if-changed=build.rs");
    if !links_with_rust_lld() {
        return;
    }
    let Ok(dir) = env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let order = Path::new(&dir).join("gma-agent.order");
    if !order.is_file() {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=gma-agent=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    println!("cargo:rustc-link-arg-bin=gma-agent=-Wl,--no-warn-symbol-ordering");
}

/// Whether rustc links with its own LLD: x86_64-unknown-linux-gnu, Rust 1.90 or later, and no
/// linker or linker flavour chosen (in the environment, `.cargo/config.toml` or RUSTFLAGS).
fn links_with_rust_lld() -> bool {
    if env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu") {
        return false;
    }
    if env::var_os("RUSTC_LINKER").is_some() {
        return false;
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags.contains("linker") || flags.contains("fuse-ld") {
        return false;
    }
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let Ok(out) = Command::new(rustc).arg("-V").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let minor = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    minor.is_some_and(|m| m >= 90)
}
