//! The `gma` command, built inside the test package so that the end-to-end tests always run
//! the command as it is in the tree (see tests/Cargo.toml).

fn main() {
    gma::main()
}
