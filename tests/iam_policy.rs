//! The IAM policies in `deploy/iam/` against the AWS operations the code calls, so the two cannot
//! drift apart. No service is needed.
//!
//! 1. The operations of `aws-sdk-kinesis` and `aws-sdk-dynamodb` are read from the SDK crates this
//!    workspace builds with (`cargo metadata`, then each crate's `src/operation/` modules).
//! 2. Every call of one of them in `src/` (`.{operation}()` whose statement ends in `.send()`) is
//!    found, with the function it is in.
//! 3. Each call is attributed to the roles that run it by following its function's callers up to
//!    an entry point: worker code (`src/worker.rs`, `spout/`, `sink/`, `stage/`, `coord/`,
//!    `state/bolt.rs`, `state/fire.rs`), the operator CLI (`src/cli/`, except `squall stream put`), or the producer
//!    helper (`squall stream put`).
//! 4. Each role's policy must allow exactly the actions its calls need: a call whose action is
//!    missing fails the test (naming the call and the fix), and so does an allowed action no call
//!    needs (least privilege).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROLES: [&str; 3] = ["worker", "cli", "producer"];

/// `put_records` -> `PutRecords`.
fn pascal(op: &str) -> String {
    op.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect()
}

/// The operation names (snake case) of an SDK crate of this workspace's lock file.
fn sdk_operations(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // the host's packages only: the other platforms' are not downloaded
    let rustc = std::process::Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .expect("running rustc -vV");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", &host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo metadata");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let manifest = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == package)
        .and_then(|p| p["manifest_path"].as_str())
        .unwrap_or_else(|| panic!("{package} is not a dependency of the workspace"));
    let dir = Path::new(manifest).parent().expect("crate dir").join("src/operation");
    let ops: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(ops.len() > 10, "{package}: only {} operations found in {}", ops.len(), dir.display());
    ops
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A source file, relative to the repository root, without its comments.
struct Source {
    path: String,
    text: String,
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            // comments and doc comments name operations too; only code counts
            let text = text
                .lines()
                .map(|l| if l.trim_start().starts_with("//") { "" } else { l })
                .collect::<Vec<_>>()
                .join("\n");
            let path = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            Source { path, text }
        })
        .collect()
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The name of the function the byte offset `at` is in (the nearest `fn name` before it).
fn enclosing_fn(text: &str, at: usize) -> Option<String> {
    let before = &text[..at];
    let mut from = before.len();
    while let Some(i) = before[..from].rfind("fn ") {
        let ok_start = i == 0 || !is_ident(before[..i].chars().next_back().unwrap_or(' '));
        let name: String = before[i + 3..].chars().take_while(|c| is_ident(*c)).collect();
        if ok_start && !name.is_empty() {
            return Some(name);
        }
        from = i;
    }
    None
}

/// One call of an SDK operation.
#[derive(Debug, Clone)]
struct Call {
    action: String,
    file: String,
    line: usize,
    func: Option<String>,
}

/// Every SDK operation call in the sources.
fn calls(sources: &[Source]) -> Vec<Call> {
    let services = [("kinesis", sdk_operations("aws-sdk-kinesis")), ("dynamodb", sdk_operations("aws-sdk-dynamodb"))];
    let mut out = Vec::new();
    for s in sources {
        for (service, ops) in &services {
            // a file builds requests of the service whose crate it names
            let uses = match *service {
                "kinesis" => s.text.contains("aws_sdk_kinesis") || s.text.contains("Client"),
                _ => s.text.contains("aws_sdk_dynamodb"),
            };
            if !uses {
                continue;
            }
            for op in ops {
                let needle = format!(".{op}()");
                for (at, _) in s.text.match_indices(&needle) {
                    // an SDK request is built on a client: `client.op()`, `self.client\n.op()`
                    // (a wrapper of ours with the same name is called on something else)
                    let before = &s.text[..at];
                    let from = before.rfind([';', '{', '}', '(', ',', '=']).map_or(0, |i| i + 1);
                    if !before[from..].contains("client") {
                        continue;
                    }
                    if *service == "kinesis" && s.text.contains("aws_sdk_dynamodb") {
                        continue;
                    }
                    out.push(Call {
                        action: format!("{service}:{}", pascal(op)),
                        file: s.path.clone(),
                        line: line_of(&s.text, at),
                        func: enclosing_fn(&s.text, at),
                    });
                }
            }
        }
    }
    out
}

/// The roles of an entry point: a call of `callee` in `file`, or `None` when the file is shared
/// code whose callers decide.
fn entry_roles(file: &str, callee: &str) -> Option<BTreeSet<&'static str>> {
    let worker = [
        "src/worker.rs",
        "src/spout/",
        "src/sink/",
        "src/stage/",
        "src/coord/",
        "src/state/bolt.rs",
        "src/state/fire.rs",
    ];
    if file == "src/cli/stream.rs" {
        // `squall stream put` is the producer helper; the other stream commands are operator tools
        return Some(BTreeSet::from([if callee == "put_records" { "producer" } else { "cli" }]));
    }
    if file.starts_with("src/cli/") || file == "src/main.rs" || file.starts_with("src/bin/") {
        return Some(BTreeSet::from(["cli"]));
    }
    if worker.iter().any(|w| file.starts_with(w)) {
        return Some(BTreeSet::from(["worker"]));
    }
    None
}

/// How a function is called: a method (`x.name(`), an associated function (`Type::name(`), or a
/// free function of a module (`module::name(`, or unqualified in its own file or where imported).
enum FnKind {
    Method(String),
    Assoc(String),
    Free(Vec<String>),
}

fn fn_kind(sources: &[Source], file: &str, func: &str) -> FnKind {
    let Some(src) = sources.iter().find(|s| s.path == file) else { return FnKind::Free(Vec::new()) };
    let text = &src.text;
    let def = text.find(&format!("fn {func}(")).or_else(|| text.find(&format!("fn {func}<"))).unwrap_or(0);
    let line_start = text[..def].rfind('\n').map_or(0, |i| i + 1);
    if !text[line_start..def].starts_with(' ') {
        // a free function: its module's names (`kinesis/admin.rs` -> `admin`, `kinesis`)
        let mods = Path::new(file)
            .with_extension("")
            .iter()
            .skip(1)
            .map(|c| c.to_string_lossy().into_owned())
            .filter(|c| c != "mod")
            .collect();
        return FnKind::Free(mods);
    }
    let impl_line = text[..def].rfind("\nimpl").map_or("", |i| text[i + 1..].lines().next().unwrap_or(""));
    let head = impl_line.split(" for ").last().unwrap_or(impl_line).trim_start_matches("impl");
    let head = if head.starts_with('<') { &head[head.find('>').map_or(0, |i| i + 1)..] } else { head };
    let ty: String = head.trim().chars().take_while(|c| is_ident(*c)).collect();
    let sig = &text[def..text[def..].find(')').map_or(text.len(), |i| def + i)];
    if sig.contains("self") { FnKind::Method(ty) } else { FnKind::Assoc(ty) }
}

/// Whether the text `before` a `func(` in source `s` calls `file`'s function of that kind.
fn calls_it(kind: &FnKind, file: &str, s: &Source, before: &str, func: &str) -> bool {
    match kind {
        FnKind::Method(ty) => before.ends_with('.') && (s.path == file || s.text.contains(ty.as_str())),
        FnKind::Assoc(ty) => before.ends_with(&format!("{ty}::")) || (s.path == file && before.ends_with("Self::")),
        FnKind::Free(mods) => {
            if before.ends_with('.') {
                return false;
            }
            if s.path == file && !before.ends_with("::") {
                return true;
            }
            let imported = s.text.lines().any(|l| l.trim_start().starts_with("use ") && l.contains(func));
            mods.iter().any(|m| before.ends_with(&format!("{m}::"))) || (imported && !before.ends_with("::"))
        }
    }
}

/// The roles that run function `func` of `file`: the roles of its callers, up to entry points.
fn roles_of(
    sources: &[Source],
    file: &str,
    func: &str,
    seen: &mut BTreeSet<(String, String)>,
) -> BTreeSet<&'static str> {
    if let Some(r) = entry_roles(file, func) {
        return r;
    }
    let mut roles = BTreeSet::new();
    if !seen.insert((file.to_string(), func.to_string())) {
        return roles;
    }
    let kind = fn_kind(sources, file, func);
    for s in sources {
        for (at, _) in s.text.match_indices(&format!("{func}(")) {
            let before = &s.text[..at];
            let prev = before.chars().next_back().unwrap_or(' ');
            if is_ident(prev) || before.ends_with("fn ") {
                continue; // another name, or the definition
            }
            if !calls_it(&kind, file, s, before, func) {
                continue; // a function of the same name elsewhere
            }
            match entry_roles(&s.path, func) {
                Some(r) => roles.extend(r),
                None => {
                    if let Some(caller) = enclosing_fn(&s.text, at)
                        && (caller != func || s.path != file)
                    {
                        roles.extend(roles_of(sources, &s.path, &caller, seen));
                    }
                }
            }
        }
    }
    roles
}

/// The actions a policy document allows.
fn policy_actions(role: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("deploy/iam/{role}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let doc: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    assert_eq!(doc["Version"], "2012-10-17", "{}: Version", path.display());
    let mut out = BTreeSet::new();
    for st in doc["Statement"].as_array().unwrap_or_else(|| panic!("{}: no Statement list", path.display())) {
        assert_eq!(st["Effect"], "Allow", "{}: only Allow statements", path.display());
        let resources: Vec<&str> = match &st["Resource"] {
            serde_json::Value::String(s) => vec![s.as_str()],
            serde_json::Value::Array(a) => a.iter().filter_map(|v| v.as_str()).collect(),
            other => panic!("{}: Resource {other}", path.display()),
        };
        assert!(
            !resources.is_empty()
                && resources
                    .iter()
                    .all(|r| r.starts_with("arn:aws:") && (r.contains(":stream/") || r.contains(":table/"))),
            "{}: every statement is scoped to stream, consumer or table ARNs: {resources:?}",
            path.display()
        );
        match &st["Action"] {
            serde_json::Value::String(s) => {
                out.insert(s.clone());
            }
            serde_json::Value::Array(a) => out.extend(a.iter().filter_map(|v| v.as_str().map(str::to_string))),
            other => panic!("{}: Action {other}", path.display()),
        }
    }
    assert!(out.iter().all(|a| !a.contains('*')), "{}: no wildcard actions: {out:?}", path.display());
    out
}

/// Per role, each action it needs with the call sites (`file:line`) that need it.
type Needs = BTreeMap<&'static str, BTreeMap<String, Vec<String>>>;

/// What each role needs, from the code.
fn needed() -> (Needs, Vec<Call>) {
    let sources = sources();
    let calls = calls(&sources);
    let mut by_role = Needs::new();
    for c in &calls {
        let func = c.func.clone().unwrap_or_default();
        let roles = roles_of(&sources, &c.file, &func, &mut BTreeSet::new());
        assert!(!roles.is_empty(), "{}:{} ({func}) calls {} but no role reaches it", c.file, c.line, c.action);
        for r in roles {
            by_role.entry(r).or_default().entry(c.action.clone()).or_default().push(format!("{}:{}", c.file, c.line));
        }
    }
    (by_role, calls)
}

#[test]
fn each_role_policy_allows_exactly_the_aws_actions_its_code_calls() {
    let (by_role, calls) = needed();
    assert!(calls.len() >= 10, "too few SDK calls found ({}): the scan is broken: {calls:?}", calls.len());
    let mut problems = Vec::new();
    for role in ROLES {
        let need = by_role.get(role).cloned().unwrap_or_default();
        let have = policy_actions(role);
        eprintln!("{role}: {}", need.keys().cloned().collect::<Vec<_>>().join(", "));
        for (action, sites) in &need {
            if !have.contains(action) {
                problems.push(format!(
                    "deploy/iam/{role}.json lacks {action}, called at {}: add it (scoped to the resource it acts on)",
                    sites.join(", ")
                ));
            }
        }
        for action in have.difference(&need.keys().cloned().collect()) {
            problems.push(format!(
                "deploy/iam/{role}.json allows {action}, which no {role} code calls: remove it (least privilege)"
            ));
        }
    }
    assert!(problems.is_empty(), "IAM policies and code disagree:\n{}", problems.join("\n"));
}

#[test]
fn the_scan_finds_known_calls_and_attributes_them() {
    let (by_role, _) = needed();
    let has = |role: &str, action: &str| by_role.get(role).is_some_and(|m| m.contains_key(action));
    // one per path through the attribution: direct worker code, a shared helper reached from the
    // worker, a CLI command, the producer helper, and a DynamoDB call
    assert!(has("worker", "kinesis:GetRecords"), "{by_role:?}");
    assert!(has("worker", "kinesis:CreateStream"), "intermediate streams: {by_role:?}");
    assert!(has("cli", "kinesis:SplitShard"), "{by_role:?}");
    assert!(has("producer", "kinesis:PutRecords"), "{by_role:?}");
    assert!(!has("producer", "kinesis:SplitShard"), "{by_role:?}");
    assert!(has("worker", "dynamodb:PutItem"), "{by_role:?}");
    assert!(!has("worker", "dynamodb:Scan"), "the scan is for audits only: {by_role:?}");
    assert_eq!(pascal("describe_stream_summary"), "DescribeStreamSummary");
}
