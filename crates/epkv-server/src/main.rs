//! epkv-server: placeholder.
fn main() {}
