//! The layers as cargo holds them. A crate cannot name what its manifest
//! leaves out, so this table of which of our crates each one may depend on
//! is the whole picture; also that the embedded adapters build without any
//! AWS crate, that no dev-dependency closes a circle, and that only tests
//! use the testkit. `cargo test -p agent-runs --test crates -- --nocapture`
//! prints how many crates each bottom layer builds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::LazyLock;

use serde_json::Value;

/// Each crate of ours, bottom up, and the crates of ours it may depend on.
const LAYERS: &[(&str, &[&str])] = &[
    ("agent-runs-domain", &[]),
    ("agent-runs-ports", &["agent-runs-domain"]),
    ("agent-runs-platform", &["agent-runs-domain"]),
    ("agent-runs-embedded", &["agent-runs-domain", "agent-runs-ports"]),
    ("agent-runs-aws", &["agent-runs-domain", "agent-runs-platform", "agent-runs-ports"]),
    ("agent-runs-agents", &["agent-runs-domain", "agent-runs-platform", "agent-runs-ports"]),
    ("agent-runs-service", &["agent-runs-agents", "agent-runs-domain", "agent-runs-platform", "agent-runs-ports"]),
    (
        "agent-runs-lambda",
        &["agent-runs-aws", "agent-runs-domain", "agent-runs-platform", "agent-runs-ports", "agent-runs-service"],
    ),
    ("agent-runs-testkit", &["agent-runs-aws", "agent-runs-domain", "agent-runs-embedded", "agent-runs-ports"]),
    (
        "agent-runs",
        &[
            "agent-runs-agents",
            "agent-runs-aws",
            "agent-runs-domain",
            "agent-runs-embedded",
            "agent-runs-lambda",
            "agent-runs-platform",
            "agent-runs-ports",
            "agent-runs-service",
        ],
    ),
    ("agent-runs-bench", &[]),
];

/// A Lambda function's crate: its `main` and the glue, nothing else.
const FUNCTION: &[&str] = &["agent-runs-lambda"];

/// Read once for all the tests here: `cargo metadata` takes a while.
static WORKSPACE: LazyLock<Workspace> = LazyLock::new(Workspace::read);

struct Workspace {
    metadata: Value,
}

impl Workspace {
    fn read() -> Self {
        // This machine's platform only: the others' crates are not downloaded.
        let rustc =
            Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into())).arg("-vV").output().unwrap();
        let rustc = String::from_utf8(rustc.stdout).unwrap();
        let host = rustc.lines().find_map(|line| line.strip_prefix("host: ")).unwrap();
        let output = Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1", "--locked", "--offline", "--filter-platform", host])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        Workspace { metadata: serde_json::from_slice(&output.stdout).unwrap() }
    }

    fn packages(&self) -> &[Value] {
        self.metadata["packages"].as_array().unwrap()
    }

    fn name_of(&self, id: &str) -> &str {
        self.packages().iter().find(|package| package["id"] == id).unwrap()["name"].as_str().unwrap()
    }

    /// Our crates: name to (normal, dev) dependencies of ours.
    fn ours(&self) -> BTreeMap<&str, (BTreeSet<&str>, BTreeSet<&str>)> {
        let members: BTreeSet<&str> =
            self.metadata["workspace_members"].as_array().unwrap().iter().map(|id| id.as_str().unwrap()).collect();
        let mut crates = BTreeMap::new();
        for package in self.packages().iter().filter(|package| members.contains(package["id"].as_str().unwrap())) {
            let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
            for dependency in package["dependencies"].as_array().unwrap() {
                let name = dependency["name"].as_str().unwrap();
                if name.starts_with("agent-runs") {
                    if dependency["kind"] == "dev" {
                        dev.insert(name)
                    } else {
                        normal.insert(name)
                    };
                }
            }
            crates.insert(package["name"].as_str().unwrap(), (normal, dev));
        }
        crates
    }

    /// Every crate `name` builds against, its own normal dependencies and
    /// theirs (build dependencies included: they are compiled too).
    fn builds(&self, name: &str) -> BTreeSet<&str> {
        let nodes: BTreeMap<&str, &Value> = self.metadata["resolve"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|node| (node["id"].as_str().unwrap(), node))
            .collect();
        let start = self.packages().iter().find(|package| package["name"] == name).unwrap()["id"].as_str().unwrap();
        let (mut seen, mut todo) = (BTreeSet::new(), vec![start]);
        while let Some(id) = todo.pop() {
            if !seen.insert(id) {
                continue;
            }
            for dependency in nodes[id]["deps"].as_array().unwrap() {
                if dependency["dep_kinds"].as_array().unwrap().iter().any(|kind| kind["kind"] != "dev") {
                    todo.push(dependency["pkg"].as_str().unwrap());
                }
            }
        }
        seen.into_iter().map(|id| self.name_of(id)).collect()
    }
}

#[test]
fn each_crate_depends_only_on_the_layers_below_it() {
    let workspace = &*WORKSPACE;
    let crates = workspace.ours();
    let layers: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let mut functions = 0;
    for (name, (normal, dev)) in &crates {
        let allowed = match layers.get(name) {
            Some(allowed) => *allowed,
            None if normal.iter().copied().eq(FUNCTION.iter().copied()) => {
                functions += 1;
                FUNCTION
            }
            None => panic!("{name} is not in LAYERS: say where it sits"),
        };
        let extra: Vec<&&str> = normal.iter().filter(|dependency| !allowed.contains(dependency)).collect();
        assert!(extra.is_empty(), "{name} may not depend on {extra:?} (LAYERS)");
        for dependency in dev {
            let above = workspace.builds(dependency);
            assert!(!above.contains(name), "{name}'s tests depend on {dependency}, which is built on {name}: a circle");
        }
    }
    let crates = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../functions")).unwrap().count();
    assert_eq!(functions, crates, "every functions/* crate depends on the Lambda glue alone");
}

#[test]
fn the_bottom_layers_build_without_the_aws_sdk_or_sqlite_where_they_should() {
    let workspace = &*WORKSPACE;
    for bottom in ["agent-runs-domain", "agent-runs-ports", "agent-runs-embedded"] {
        let builds = workspace.builds(bottom);
        let aws: Vec<&&str> =
            builds.iter().filter(|name| name.starts_with("aws") || name.starts_with("lambda")).collect();
        assert!(aws.is_empty(), "{bottom} builds {aws:?}");
        println!("{bottom}: {} crates", builds.len());
    }
    for name in workspace
        .ours()
        .keys()
        .filter(|name| !["agent-runs", "agent-runs-embedded", "agent-runs-testkit"].contains(name))
    {
        assert!(!workspace.builds(name).contains("rusqlite"), "{name} links SQLite: only the embedded server may");
    }
}

#[test]
fn only_tests_use_the_testkit() {
    let workspace = &*WORKSPACE;
    for (name, (normal, _)) in workspace.ours() {
        assert!(!normal.contains("agent-runs-testkit"), "{name} ships the testkit");
    }
}

/// The domain depends on nothing that does I/O or needs a runtime.
#[test]
fn the_domain_depends_only_on_pure_libraries() {
    let workspace = &*WORKSPACE;
    let domain = workspace.packages().iter().find(|package| package["name"] == "agent-runs-domain").unwrap();
    let pure = [
        "base64",
        "chrono",
        "fancy-regex",
        "jsonschema",
        "rand",
        "regex",
        "ring",
        "serde",
        "serde_json",
        "serde_json_canonicalizer",
        "sha2",
        "thiserror",
        "ulid",
    ];
    for dependency in domain["dependencies"].as_array().unwrap() {
        let name = dependency["name"].as_str().unwrap();
        assert!(
            dependency["kind"] == "dev" || pure.contains(&name),
            "the domain may not depend on {name}: keep I/O in the adapters"
        );
    }
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
}

/// A crate's top-level modules and the ones each names (`crate::<module>`),
/// from its code (not its tests or comments).
fn modules(krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&root).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs").to_owned();
        // A test module may reach anywhere.
        let test = file.file_name().is_some_and(|name| name == "tests.rs")
            || relative.components().any(|part| part.as_os_str() == "tests");
        if module == "lib" || module == "main" || test {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap()
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let uses = graph.entry(module.clone()).or_default();
        for (at, _) in code.match_indices("crate::") {
            let name: String =
                code[at + "crate::".len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let is_module = root.join(format!("{name}.rs")).exists() || root.join(&name).is_dir();
            if is_module && name != module {
                uses.insert(name);
            }
        }
    }
    graph
}

/// A circle of modules, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|seen| seen == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Inside a crate too, modules form layers: none name each other in a
/// circle, and in the service only the composition root names the API,
/// the workers and the webhooks together (nothing names `services`).
/// `-- --nocapture` prints each crate's graph.
#[test]
fn the_modules_of_each_crate_form_layers_without_a_circle() {
    for krate in ["domain", "ports", "platform", "embedded", "aws", "agents", "service", "lambda", "cli", "testkit"] {
        let graph = modules(krate);
        for (module, uses) in &graph {
            println!("{krate}: {module} -> {}", uses.iter().cloned().collect::<Vec<_>>().join(", "));
        }
        assert_eq!(circle(&graph), None, "modules of crates/{krate} that name each other in a circle");
    }
    let service = modules("service");
    assert!(service["api"].contains("commands"), "an edge is seen: {service:?}");
    for (module, uses) in &service {
        assert!(!uses.contains("services"), "{module} reaches up to the composition root");
    }
}
