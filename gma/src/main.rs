//! `gma`: the one operator binary; everything is in the library (src/lib.rs).

fn main() {
    gma::main()
}
