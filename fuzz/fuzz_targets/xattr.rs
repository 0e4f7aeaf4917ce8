//! Runs arbitrary bytes through the checks of a value a client sends with its extended
//! attributes (datatype XATTR), and an accepted one through parsing, macro expansion
//! and encoding: nothing may panic, and what is accepted reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    epkv_engine::fuzzing::xattr_value(data);
});
