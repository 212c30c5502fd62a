//! The crate's layers, read from its sources: which top-level modules name
//! which (`crate::<module>`), that the SDK set-up names none, and that no
//! modules name each other in a circle. The domain is a crate of its own
//! (crates/domain), which cargo keeps from naming anything here; its
//! dependencies are checked to do no I/O. Run with
//! `cargo test -p agent-runs-shared --test layers -- --nocapture` to print
//! the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

/// Top-level module -> the top-level modules its files name.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&root).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Only the code, not its tests (a test module may reach anywhere)
        // nor its comments.
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

#[test]
fn the_modules_form_layers_without_a_circle() {
    let graph = graph();
    for (module, uses) in &graph {
        println!("{module} -> {}", uses.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    assert!(graph.len() > 10, "the sources were read: {graph:?}");
    assert!(graph["api"].contains("store"), "an edge is seen");
    assert_eq!(circle(&graph), None, "modules that name each other in a circle");
    assert!(graph["sdk"].is_empty(), "the SDK set-up stands alone: {:?}", graph["sdk"]);
    for adapter_level in ["store", "queue", "agents", "api", "worker"] {
        for above in ["aws", "services", "lambda"] {
            assert!(!graph[adapter_level].contains(above), "{adapter_level} must not reach up to {above}");
        }
    }
}

/// The domain crate depends on nothing that does I/O or needs a runtime:
/// no HTTP, AWS, SQLite, async runtime, logging or the service's crates.
#[test]
fn the_domain_crate_depends_only_on_pure_libraries() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/domain/Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(manifest).unwrap().parse().unwrap();
    let dependencies: BTreeSet<&str> =
        manifest["dependencies"].as_table().unwrap().keys().map(String::as_str).collect();
    let pure = [
        "base64",
        "chrono",
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
    let impure: Vec<&&str> = dependencies.iter().filter(|name| !pure.contains(name)).collect();
    assert!(impure.is_empty(), "the domain may not depend on {impure:?}: keep I/O in the adapters");
    assert!(
        manifest.get("dev-dependencies").is_none() || !manifest["dev-dependencies"].to_string().contains("agent-runs")
    );
}

/// Test-only code lives in agent-runs-testkit, and no crate that ships
/// (the library, the binary, the Lambda functions) depends on it but for
/// its tests.
#[test]
fn only_tests_depend_on_the_testkit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut manifests = vec![root.join("shared/Cargo.toml"), root.join("infra/agent-runs/Cargo.toml")];
    manifests.extend(
        std::fs::read_dir(root.join("functions")).unwrap().map(|entry| entry.unwrap().path().join("Cargo.toml")),
    );
    for crate_dir in ["crates/domain", "crates/store-sqlite", "infra/bench"] {
        manifests.push(root.join(crate_dir).join("Cargo.toml"));
    }
    for manifest in manifests {
        let parsed: toml::Table = std::fs::read_to_string(&manifest).unwrap().parse().unwrap();
        let shipped = parsed.get("dependencies").and_then(toml::Value::as_table);
        assert!(
            shipped.is_some_and(|dependencies| !dependencies.contains_key("agent-runs-testkit")),
            "{} ships the testkit",
            manifest.display()
        );
    }
    assert!(!root.join("shared/src/faults.rs").exists(), "fault injection is test-only code: crates/testkit");
}

/// SQLite is the embedded server's alone: no Lambda function, nor the
/// library they share, links rusqlite (crates/store-sqlite holds it).
#[test]
fn no_lambda_function_links_sqlite() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut manifests = vec![root.join("shared/Cargo.toml"), root.join("crates/domain/Cargo.toml")];
    manifests.extend(
        std::fs::read_dir(root.join("functions")).unwrap().map(|entry| entry.unwrap().path().join("Cargo.toml")),
    );
    for manifest in manifests {
        let parsed: toml::Table = std::fs::read_to_string(&manifest).unwrap().parse().unwrap();
        let shipped = parsed["dependencies"].as_table().unwrap();
        for sqlite in ["rusqlite", "agent-runs-store-sqlite"] {
            assert!(!shipped.contains_key(sqlite), "{} links {sqlite}", manifest.display());
        }
    }
}
