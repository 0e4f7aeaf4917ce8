//! Markdown tables generated from the single-source opcode, status, feature and bucket
//! capability tables, checked
//! against `docs/protocol.md` by a test so the document cannot drift from the code.

use crate::command::{is_durability_supported, is_preserve_ttl_supported};
use crate::feature::Feature;
use crate::opcode::Opcode;
use crate::status::Status;
use std::fmt::Write as _;

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// Returns the opcode table exactly as `docs/protocol.md` lists it.
#[must_use]
pub fn opcode_table() -> String {
    let mut s = String::from(
        "| Opcode | Name | Implemented | Quiet | Durability frame | PreserveTtl frame |\n\
         |--------|------|-------------|-------|------------------|-------------------|\n",
    );
    for op in Opcode::ALL {
        // Writing to a String cannot fail.
        let _ = writeln!(
            s,
            "| 0x{:02x} | {} | {} | {} | {} | {} |",
            op.as_u8(),
            op.name(),
            yes(op.is_implemented()),
            yes(op.is_quiet()),
            yes(is_durability_supported(*op)),
            yes(is_preserve_ttl_supported(*op)),
        );
    }
    s
}

/// Returns the status table exactly as `docs/protocol.md` lists it.
#[must_use]
pub fn status_table() -> String {
    let mut s = String::from("| Status | Name | Text |\n|--------|------|------|\n");
    for st in Status::ALL {
        let _ = writeln!(s, "| 0x{:04x} | {:?} | {} |", st.as_u16(), st, st.message());
    }
    s
}

/// Returns the HELLO feature table exactly as `docs/protocol.md` lists it: every feature
/// kv_engine knows, and whether epkv agrees to it.
#[must_use]
pub fn feature_table() -> String {
    let mut s = String::from("| Feature | Name | Agreed |\n|---------|------|--------|\n");
    for f in Feature::ALL {
        let _ = writeln!(
            s,
            "| 0x{:02x} | {} | {} |",
            f.as_u16(),
            f.name(),
            yes(f.is_implemented())
        );
    }
    s
}

/// Returns the bucket capability table exactly as `docs/protocol.md` lists it.
#[must_use]
pub fn bucket_capability_table() -> String {
    let mut s = String::from("| Capability | Why it holds |\n|------------|--------------|\n");
    for (name, why) in crate::BUCKET_CAPABILITIES {
        let _ = writeln!(s, "| `{name}` | {why} |");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(doc: &str, name: &str) -> (usize, usize) {
        let begin = format!("<!-- {name}:begin -->\n");
        let end = format!("<!-- {name}:end -->");
        let start = doc
            .find(&begin)
            .map(|i| i + begin.len())
            .expect("begin marker");
        let stop = doc[start..]
            .find(&end)
            .map(|i| start + i)
            .expect("end marker");
        (start, stop)
    }

    /// Checks the generated tables against the document; with `EPKV_BLESS=1` in the
    /// environment it rewrites the document's tables instead.
    #[test]
    fn docs_protocol_md_lists_every_opcode_and_status() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/protocol.md");
        let mut doc = std::fs::read_to_string(path).expect("docs/protocol.md exists");
        let tables = [
            ("opcode-table", opcode_table()),
            ("status-table", status_table()),
            ("feature-table", feature_table()),
            ("bucket-capability-table", bucket_capability_table()),
        ];
        if std::env::var_os("EPKV_BLESS").is_some() {
            for (name, table) in &tables {
                let (start, stop) = bounds(&doc, name);
                doc.replace_range(start..stop, table);
            }
            std::fs::write(path, &doc).expect("write docs/protocol.md");
        }
        for (name, table) in &tables {
            let (start, stop) = bounds(&doc, name);
            assert_eq!(
                &doc[start..stop],
                table,
                "docs/protocol.md {name} is stale; run EPKV_BLESS=1 cargo test -p epkv-protocol docs_protocol_md"
            );
        }
    }
}
