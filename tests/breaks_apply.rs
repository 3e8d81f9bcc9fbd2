//! The deliberate breaks of `scripts/breaks/` (which `scripts/break-test` applies to show that a
//! test fails when the behaviour it guards is broken) still apply to today's code, each names the
//! test that must catch it in `scripts/break-test`, and RELIABILITY.md documents it. No service is
//! needed; this keeps the "shown to fail" claims reproducible as the code moves.

use std::path::Path;
use std::process::Command;

#[test]
fn every_break_applies_is_mapped_to_its_test_and_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("scripts/break-test")).expect("scripts/break-test");
    let reliability = std::fs::read_to_string(root.join("RELIABILITY.md")).expect("RELIABILITY.md");
    let mut names = Vec::new();
    for e in std::fs::read_dir(root.join("scripts/breaks")).expect("scripts/breaks") {
        let p = e.unwrap().path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".patch")) else {
            continue;
        };
        let out =
            Command::new("git").arg("apply").arg("--check").arg(&p).current_dir(root).output().expect("git apply");
        assert!(
            out.status.success(),
            "scripts/breaks/{name}.patch no longer applies to the code: {}\nredo the break on today's code and \
             write the patch again (git diff > scripts/breaks/{name}.patch)",
            String::from_utf8_lossy(&out.stderr)
        );
        // `[name]="--test BINARY [FILTER]"`, `[name]="-p CRATE --test BINARY FILTER"` or
        // `[name]="--lib FILTER"`: the cargo test arguments of the test that must fail
        let args = script
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("[{name}]=\"")))
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or_else(|| panic!("scripts/break-test names no test for {name}"));
        let words: Vec<&str> = args.split_whitespace().collect();
        let named = words.windows(2).any(|w| w[0] == "--test" && !w[1].starts_with('-')) || words.contains(&"--lib");
        assert!(named, "scripts/break-test names no test binary (--test NAME) or --lib for {name}: {args}");
        assert!(
            reliability.contains(&format!("`scripts/break-test {name}`")),
            "RELIABILITY.md does not document {name}"
        );
        names.push(name.to_string());
    }
    assert!(names.len() >= 8, "breaks found: {names:?}");
}
