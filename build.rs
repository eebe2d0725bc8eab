//! Records the target triple so the library can ask the `cc` crate for the
//! matching C compiler at run time.
fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=ARRAYJIT_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
}
