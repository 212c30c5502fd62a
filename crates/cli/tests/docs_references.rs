//! Every file the README and docs/ name exists: a path in backticks or a
//! link that ends like a file (`.rs`, `.md`, `.sh`, ...) is found from the
//! repository's root, from docs/ or from a crate's sources, a bare file
//! name anywhere in the repository, and `infra/.../x.rs` under that folder.
//! A path that starts with `../` is read from the document's own folder
//! (docs/guide/ names `../api.md`); one outside the repository
//! (`../shared/...`), what a run makes (`target/...`) and URLs are not
//! checked.

use std::path::{Path, PathBuf};

const FILE_ENDINGS: [&str; 13] =
    [".rs", ".md", ".sh", ".py", ".toml", ".yaml", ".yml", ".json", ".txt", ".png", ".html", ".js", ".css"];

/// Where a relative path in the docs may start.
const ROOTS: [&str; 13] = [
    "",
    "docs",
    "crates",
    "crates/domain/src",
    "crates/ports/src",
    "crates/platform/src",
    "crates/embedded/src",
    "crates/aws/src",
    "crates/agents/src",
    "crates/service/src",
    "crates/lambda/src",
    "crates/cli/src",
    "crates/testkit/src",
];

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Every file of the repository, but build output and virtual environments.
fn files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            files(&path, found);
        } else {
            found.push(path);
        }
    }
}

/// The references a document makes: `path` in backticks, or (path) of a link.
fn references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (open, close) in [('`', '`'), ('(', ')')] {
        let mut rest = text;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + 1..];
            let Some(end) = after.find(close) else { break };
            // A link's anchor is not part of the file.
            let candidate = after[..end].split('#').next().unwrap_or_default();
            let pathlike = !candidate.is_empty()
                && candidate.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
                && FILE_ENDINGS.iter().any(|ending| candidate.ends_with(ending));
            // Absolute, or made by a run (build output).
            let checked = !candidate.starts_with('/') && !candidate.starts_with("target/");
            if pathlike && checked {
                found.push(candidate.to_owned());
            }
            rest = &after[end + 1..];
        }
    }
    found
}

/// `reference` from `document`'s folder, `..` taken away.
fn beside(document: &Path, reference: &str) -> PathBuf {
    let mut path = document.parent().unwrap().to_path_buf();
    for part in reference.split('/') {
        match part {
            ".." => {
                path.pop();
            }
            "." => {}
            part => path.push(part),
        }
    }
    path
}

/// Whether `reference`, named in `document`, is a file: one that starts
/// with `../` from the document's own folder (`../shared/...`, the team's
/// folder beside the repository, and anything outside it are not
/// checked), any other from one of the roots or the document's folder.
fn exists(reference: &str, document: &Path, root: &Path, all: &[PathBuf]) -> bool {
    if reference.starts_with("../shared/") {
        // The team's folder beside the repository, as the docs write it.
        return true;
    }
    if reference.starts_with("../") {
        let path = beside(document, reference);
        return !path.starts_with(root) || path.exists();
    }
    if let Some((folder, name)) = reference.split_once("/.../") {
        return all.iter().any(|file| file.starts_with(root.join(folder)) && file.ends_with(name));
    }
    if !reference.contains('/') {
        return all.iter().any(|file| file.file_name().is_some_and(|file| file == reference));
    }
    ROOTS.iter().any(|start| root.join(start).join(reference).exists()) || beside(document, reference).exists()
}

#[test]
fn every_file_the_docs_name_exists() {
    let root = repository();
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut documents = vec![root.join("README.md")];
    for folder in ["docs", "docs/guide"] {
        documents.extend(
            std::fs::read_dir(root.join(folder))
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.extension().is_some_and(|extension| extension == "md")),
        );
    }
    let mut checked = 0;
    let mut missing = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        for reference in references(&text) {
            checked += 1;
            if !exists(&reference, document, &root, &all) {
                missing.push(format!("{}: {reference}", document.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(checked > 50, "the references were read: {checked}");
    assert!(missing.is_empty(), "the docs name files that do not exist:\n{}", missing.join("\n"));
}
