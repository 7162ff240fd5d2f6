//! The dependency direction written in ARCHITECTURE.md, checked: every `crate::<module>` path in
//! `src/` outside tests must name a module of a lower layer than its own.

use std::collections::BTreeMap;
use std::path::Path;

/// The `layers` block of ARCHITECTURE.md: module → layer.
fn layers(doc: &str) -> BTreeMap<String, usize> {
    let block = doc
        .split("```layers\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("ARCHITECTURE.md has a ```layers block");
    let mut out = BTreeMap::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (n, mods) = line.split_once(':').expect("`N: module ...`");
        let n: usize = n.trim().parse().expect("a layer number");
        for m in mods.split_whitespace() {
            assert!(
                out.insert(m.to_string(), n).is_none(),
                "{m} is listed twice"
            );
        }
    }
    out
}

/// Code without comments and without a trailing `#[cfg(test)] mod NAME { ... }`.
fn code_of(text: &str) -> String {
    let cut = regex::Regex::new(r"#\[cfg\(test\)\]\s*mod \w+\s*\{").unwrap();
    let text = match cut.find(text) {
        Some(m) => &text[..m.start()],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// (module, file, imported module) for every cross-module `crate::` path outside tests.
fn imports(src: &Path) -> Vec<(String, String, String)> {
    let path_re = regex::Regex::new(r"\bcrate::([a-z_][a-z0-9_]*)").unwrap();
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(src).unwrap().to_string_lossy().into_owned();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let top = rel.split('/').next().unwrap().trim_end_matches(".rs");
            if !name.ends_with(".rs")
                || matches!(top, "main" | "lib")
                || name.starts_with("tests")
                || rel.split('/').any(|c| c == "tests")
            {
                continue;
            }
            let code = code_of(&std::fs::read_to_string(&p).unwrap());
            for m in path_re.captures_iter(&code) {
                if &m[1] != top {
                    out.push((top.to_string(), rel.clone(), m[1].to_string()));
                }
            }
        }
    }
    out
}

/// The imports that go against the layers (or name a module the table lacks).
fn violations(layers: &BTreeMap<String, usize>, src: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for (from, file, to) in imports(src) {
        match (layers.get(&from), layers.get(&to)) {
            (Some(a), Some(b)) if b < a => {}
            (Some(a), Some(b)) => bad.push(format!(
                "{file}: `{from}` (layer {a}) uses `{to}` (layer {b}); a module may use only lower layers"
            )),
            _ => bad.push(format!(
                "{file}: `{from}` or `{to}` is missing from ARCHITECTURE.md's layers"
            )),
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

#[test]
fn modules_import_only_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let layers = layers(&doc);
    let bad = violations(&layers, &root.join("src"));
    assert!(
        bad.is_empty(),
        "imports against ARCHITECTURE.md:\n{}",
        bad.join("\n")
    );
    // Every top-level module is placed.
    for e in std::fs::read_dir(root.join("src")).unwrap().flatten() {
        let name = e
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if matches!(name.as_str(), "main" | "lib") || name.starts_with("tests") {
            continue;
        }
        assert!(
            layers.contains_key(&name),
            "`{name}` has no layer in ARCHITECTURE.md"
        );
    }
}

#[test]
fn a_back_edge_is_caught() {
    // A tree where the plan reaches up into the CLI.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("plan.rs"),
        "use crate::cli::x; // crate::engine\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("cli.rs"),
        "use crate::plan::x;\n#[cfg(test)]\nmod tests {\n use crate::cli::y;\n}\n",
    )
    .unwrap();
    let layers = layers("```layers\n0: plan\n1: cli\n```\n");
    assert_eq!(
        violations(&layers, tmp.path()),
        vec!["plan.rs: `plan` (layer 0) uses `cli` (layer 1); a module may use only lower layers"]
    );
}
