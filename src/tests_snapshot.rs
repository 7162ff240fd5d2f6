//! Snapshot tests of what dbcage prints: `assert_snapshot("name", &text)` compares the text with
//! `tests/snapshots/name.txt`; `DBCAGE_BLESS=1 cargo test` writes the files instead (review the
//! diff before committing). Hand-written (a dozen lines) rather than the `insta` crate, in the
//! shape the import tests already use for their expected policies.

use std::path::Path;

#[track_caller]
pub fn assert_snapshot(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("DBCAGE_BLESS").is_some() {
        std::fs::write(&path, got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with DBCAGE_BLESS=1 to create it from:\n{got}",
            path.display()
        )
    });
    if got != want {
        panic!(
            "output differs from {} (DBCAGE_BLESS=1 to accept it):\n--- want\n{want}\n--- got\n{got}",
            path.display()
        );
    }
}
