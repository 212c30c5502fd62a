//! JSON Schemas the service compiles and checks values against: a tool's
//! `parameters`, an MCP tool's `inputSchema`, a question's answer schema.
//! Whoever wrote the schema (an agent's author, an MCP server, a model) may
//! be hostile, so its cost is bounded: patterns have a size limit and run
//! on a linear-time engine (or, for a schema kept from before, with a
//! backtracking limit), a schema holds a bounded number of them, its
//! references may not recurse or expand past a limit, and a schema is
//! compiled once per process however often it is checked against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use jsonschema::{PatternOptions, Validator};
use serde_json::Value;

/// The most patterns (`pattern` keywords and `patternProperties` keys) a
/// schema given now may hold, and one kept from before.
pub const MAX_SCHEMA_PATTERNS: usize = 32;
const MAX_KEPT_SCHEMA_PATTERNS: usize = 512;

/// What one compiled pattern may take, and its matching cache (as for a
/// policy's `matches`): a pattern that compiles large (`(.{100}){100}`) is
/// refused rather than held.
const MAX_PATTERN_PROGRAM_BYTES: usize = 64 * 1024;
const MAX_PATTERN_CACHE_BYTES: usize = 64 * 1024;
/// Steps one match of a kept schema's look-around or back-reference may
/// take before it fails.
const MAX_BACKTRACK_STEPS: usize = 10_000;

/// The schema objects a check may visit, references followed: a few
/// hundred bytes of `$defs` that each refer twice to the next stand for
/// an exponentially large schema.
const MAX_EXPANDED_NODES: usize = 100_000;
/// How many references a chain of them may follow.
const MAX_REFERENCE_DEPTH: usize = 32;

/// What the compiled schemas kept per process may hold, by count, by the
/// size of their text and by their patterns (each pattern at most 128 KiB
/// with its cache); past any, the cache starts again. A larger schema is
/// compiled each time.
const MAX_CACHED_SCHEMAS: usize = 256;
const MAX_CACHED_BYTES: usize = 8 * 1024 * 1024;
const MAX_CACHED_SCHEMA_BYTES: usize = 512 * 1024;
const MAX_CACHED_PATTERNS: usize = 2_048;

#[derive(Default)]
struct Cache {
    schemas: HashMap<String, CompiledSchema>,
    bytes: usize,
    patterns: usize,
}

static COMPILED: Mutex<Option<Cache>> = Mutex::new(None);

/// A compiled schema, shared by whoever compiled the same one.
#[derive(Clone)]
pub struct CompiledSchema(Arc<Validator>);

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("CompiledSchema")
    }
}

/// Where a schema comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Given now (`agents put`, a model's question): held to every limit.
    Given,
    /// Kept from before (a stored definition or question): still read when
    /// a pattern needs backtracking, with as many patterns as an earlier
    /// release allowed.
    Kept,
    /// Listed by an MCP server: a pattern that needs backtracking is run
    /// with a limit, as for a kept schema; the pattern count of a given one.
    Listed,
}

/// How many patterns `value` holds, counted as a schema would use them.
fn patterns_in(value: &Value) -> usize {
    match value {
        Value::Object(fields) => fields
            .iter()
            .map(|(key, inner)| {
                let own = match (key.as_str(), inner) {
                    ("pattern", Value::String(_)) => 1,
                    ("patternProperties", Value::Object(patterns)) => patterns.len(),
                    _ => 0,
                };
                own + patterns_in(inner)
            })
            .sum(),
        Value::Array(items) => items.iter().map(patterns_in).sum(),
        _ => 0,
    }
}

/// The objects and arrays a check of `schema` may visit, its references
/// (JSON Pointers into it) followed; refused when a reference is not a
/// pointer into the schema, when one leads back to a schema it is inside
/// (a check could then take time exponential in the value's depth), when
/// references nest past [`MAX_REFERENCE_DEPTH`], when a schema with
/// references has an `$id` below its root (its pointers would then read
/// from there), or past [`MAX_EXPANDED_NODES`].
fn expanded_size(schema: &Value) -> Result<usize, String> {
    #[derive(Default)]
    struct Seen {
        references: usize,
        inner_ids: usize,
    }
    struct Walk<'a> {
        root: &'a Value,
        sizes: HashMap<String, usize>,
        following: Vec<String>,
        seen: Seen,
    }
    impl Walk<'_> {
        /// A schema (or an array of them) at `at`.
        fn size(&mut self, value: &Value, at: &str) -> Result<usize, String> {
            let mut size = 1;
            let mut children: Vec<(String, &Value)> = Vec::new();
            match value {
                Value::Object(fields) => {
                    for keyword in ["$dynamicRef", "$recursiveRef"] {
                        if fields.contains_key(keyword) {
                            return Err(format!("it uses `{keyword}`; write the schema out, with `$ref` to `$defs`"));
                        }
                    }
                    if !at.is_empty() && fields.get("$id").is_some_and(Value::is_string) {
                        self.seen.inner_ids += 1;
                    }
                    if let Some(reference) = fields.get("$ref") {
                        self.seen.references += 1;
                        size += self.reference(reference, at)?;
                    }
                    for (key, inner) in fields {
                        let here = format!("{at}/{}", escape(key));
                        match (key.as_str(), inner) {
                            // Values, not schemas.
                            ("enum" | "const" | "default" | "examples", _) => {}
                            // Maps whose keys are names, not keywords.
                            (
                                "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas",
                                Value::Object(named),
                            ) => children
                                .extend(named.iter().map(|(name, inner)| (format!("{here}/{}", escape(name)), inner))),
                            _ => children.push((here, inner)),
                        }
                    }
                }
                Value::Array(items) => {
                    children.extend(items.iter().enumerate().map(|(index, inner)| (format!("{at}/{index}"), inner)))
                }
                _ => return Ok(0),
            }
            for (path, inner) in children {
                size = size.saturating_add(self.size(inner, &path)?);
                if size > MAX_EXPANDED_NODES {
                    return Err(too_large());
                }
            }
            Ok(size)
        }

        fn reference(&mut self, reference: &Value, at: &str) -> Result<usize, String> {
            let pointer = reference.as_str().and_then(|text| text.strip_prefix('#')).map(percent_decoded);
            let Some(pointer) = pointer.filter(|pointer| pointer.is_empty() || pointer.starts_with('/')) else {
                return Err("its `$ref` must be a JSON Pointer into the schema itself (`#/$defs/...`)".into());
            };
            let encloses = at == pointer || at.starts_with(&format!("{pointer}/"));
            if encloses || self.following.contains(&pointer) {
                return Err(format!(
                    "its `$ref` `#{pointer}` leads back to a schema it is inside: a schema may not recurse"
                ));
            }
            if self.following.len() >= MAX_REFERENCE_DEPTH {
                return Err(format!("its references lead through more than {MAX_REFERENCE_DEPTH} schemas"));
            }
            if let Some(size) = self.sizes.get(&pointer) {
                return Ok(*size);
            }
            let root = self.root;
            let target =
                root.pointer(&pointer).ok_or_else(|| format!("its `$ref` `#{pointer}` names nothing in it"))?;
            self.following.push(pointer.clone());
            let size = self.size(target, &pointer);
            self.following.pop();
            let size = size?;
            self.sizes.insert(pointer, size);
            Ok(size)
        }
    }
    fn escape(key: &str) -> String {
        key.replace('~', "~0").replace('/', "~1")
    }
    /// A URI fragment's `%XX` escapes read (`List%3CItem%3E`).
    fn percent_decoded(fragment: &str) -> String {
        let bytes = fragment.as_bytes();
        let mut decoded = Vec::with_capacity(bytes.len());
        let mut index = 0;
        while index < bytes.len() {
            let hex = bytes.get(index + 1..index + 3).and_then(|pair| std::str::from_utf8(pair).ok());
            match (bytes[index], hex.and_then(|pair| u8::from_str_radix(pair, 16).ok())) {
                (b'%', Some(byte)) => {
                    decoded.push(byte);
                    index += 3;
                }
                (byte, _) => {
                    decoded.push(byte);
                    index += 1;
                }
            }
        }
        String::from_utf8_lossy(&decoded).into_owned()
    }
    fn too_large() -> String {
        format!("its references expand it past {MAX_EXPANDED_NODES} schemas")
    }
    let mut walk = Walk { root: schema, sizes: HashMap::new(), following: Vec::new(), seen: Seen::default() };
    let size = walk.size(schema, "")?;
    if walk.seen.references > 0 && walk.seen.inner_ids > 0 {
        return Err("it has `$ref` and an `$id` below its root: keep one `$id`, at the root".into());
    }
    Ok(size)
}

/// `schema`, given now, compiled, or what is wrong with it: patterns must
/// run in linear time (no look-around or back-references). The same
/// schema is compiled once and shared.
pub fn compile_schema(schema: &Value) -> Result<CompiledSchema, String> {
    compile(schema, Source::Given)
}

/// `schema`, kept from before, compiled: as [`compile_schema`], but a
/// pattern a linear-time engine cannot run is run with a backtracking
/// limit, and more patterns are allowed (what an earlier release accepted
/// still reads).
pub fn compile_kept_schema(schema: &Value) -> Result<CompiledSchema, String> {
    compile(schema, Source::Kept)
}

/// `schema`, as an MCP server lists it, compiled: as [`compile_schema`],
/// but a pattern a linear-time engine cannot run is run with a
/// backtracking limit.
pub fn compile_listed_schema(schema: &Value) -> Result<CompiledSchema, String> {
    compile(schema, Source::Listed)
}

/// `value` as JSON text with every object's keys sorted and every number
/// as written (RFC 8785's text would write integers as doubles, so two
/// schemas could share it; serde_json's own keeps keys in the order read
/// when a crate in the build asks it to).
fn exact_text(value: &Value, out: &mut String) {
    match value {
        Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            out.push('{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                exact_text(&fields[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                exact_text(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn compile(schema: &Value, source: Source) -> Result<CompiledSchema, String> {
    let mut key = String::from(match source {
        Source::Given => "g:",
        Source::Kept => "k:",
        Source::Listed => "l:",
    });
    exact_text(schema, &mut key);
    let cached = || {
        let cache = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
        cache.as_ref().and_then(|cache| cache.schemas.get(&key).cloned())
    };
    if let Some(found) = cached() {
        return Ok(found);
    }
    let patterns = patterns_in(schema);
    let most = if source == Source::Kept { MAX_KEPT_SCHEMA_PATTERNS } else { MAX_SCHEMA_PATTERNS };
    if patterns > most {
        return Err(format!("it holds {patterns} patterns; at most {most} are allowed"));
    }
    expanded_size(schema)?;
    let linear = PatternOptions::regex().size_limit(MAX_PATTERN_PROGRAM_BYTES).dfa_size_limit(MAX_PATTERN_CACHE_BYTES);
    let validator = match (jsonschema::options().with_pattern_options(linear).build(schema), source) {
        (Ok(validator), _) => validator,
        (Err(_), Source::Kept | Source::Listed) => jsonschema::options()
            .with_pattern_options(
                PatternOptions::fancy_regex()
                    .backtrack_limit(MAX_BACKTRACK_STEPS)
                    .size_limit(MAX_PATTERN_PROGRAM_BYTES)
                    .dfa_size_limit(MAX_PATTERN_CACHE_BYTES),
            )
            .build(schema)
            .map_err(|error| error.to_string())?,
        (Err(error), Source::Given) => {
            let text = error.to_string();
            return Err(if text.contains("regular expression") || text.contains("regex") {
                format!(
                    "{text} (patterns are regular expressions without look-around or back-references, at most {MAX_PATTERN_PROGRAM_BYTES} bytes once compiled)"
                )
            } else {
                text
            });
        }
    };
    let compiled = CompiledSchema(Arc::new(validator));
    if key.len() <= MAX_CACHED_SCHEMA_BYTES {
        let mut cache = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
        let cache = cache.get_or_insert_with(Cache::default);
        if cache.schemas.len() >= MAX_CACHED_SCHEMAS
            || cache.bytes + key.len() > MAX_CACHED_BYTES
            || cache.patterns + patterns > MAX_CACHED_PATTERNS
        {
            *cache = Cache::default();
        }
        cache.bytes += key.len();
        cache.patterns += patterns;
        cache.schemas.insert(key, compiled.clone());
    }
    Ok(compiled)
}

impl CompiledSchema {
    pub fn is_valid(&self, value: &Value) -> bool {
        self.0.is_valid(value)
    }

    /// What is wrong with `value`: at most `most` problems, each
    /// `at /path: ...` when not at the root; empty when it matches.
    pub fn problems(&self, value: &Value, most: usize) -> Vec<String> {
        self.0
            .iter_errors(value)
            .take(most)
            .map(|error| {
                let at = error.instance_path().to_string();
                if at.is_empty() { error.to_string() } else { format!("at {at}: {error}") }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns_run_in_linear_time_and_compile_small() {
        // Back-references need backtracking: refused.
        let backtracking = json!({"type": "string", "not": {"pattern": r"^(a|a?)+\1b$"}});
        assert!(compile_schema(&backtracking).is_err());
        // A pattern fine for a backtracking engine but slow for it runs here
        // in time linear in the text.
        let nested = compile_schema(&json!({"type": "string", "pattern": "^(a|a?)+b$"})).unwrap();
        let long = "a".repeat(8_000);
        assert!(!nested.is_valid(&json!(long)));
        // One that compiles large is refused, not held.
        let large = compile_schema(&json!({"type": "string", "pattern": "(.{100}){100}N"})).unwrap_err();
        assert!(large.contains("at most 65536 bytes once compiled"), "{large}");
        // Look-around has no linear-time match.
        assert!(compile_schema(&json!({"pattern": "^(?=.*[A-Z]).+$"})).is_err());
        // What a schema usually holds still works.
        let usual = compile_schema(&json!({"type": "string", "pattern": "^[a-z0-9-]{1,64}$"})).unwrap();
        assert!(usual.is_valid(&json!("feature-x")) && !usual.is_valid(&json!("Feature X")));
    }

    #[test]
    fn a_schema_holds_a_bounded_number_of_patterns() {
        let properties: serde_json::Map<String, Value> = (0..=MAX_SCHEMA_PATTERNS)
            .map(|index| (format!("p{index}"), json!({"type": "string", "pattern": format!("^x{index}$")})))
            .collect();
        let problem = compile_schema(&json!({"type": "object", "properties": properties})).unwrap_err();
        assert!(problem.contains("33 patterns; at most 32"), "{problem}");
        let keyed: serde_json::Map<String, Value> =
            (0..40).map(|index| (format!("^k{index}$"), json!({"type": "string"}))).collect();
        assert!(compile_schema(&json!({"patternProperties": keyed})).is_err());
        // A property that is named `pattern` is no pattern.
        assert_eq!(patterns_in(&json!({"properties": {"pattern": {"type": "string"}}})), 0);
    }

    /// What an earlier release accepted (look-around, many patterns) still
    /// reads when kept; a schema given now is held to every limit.
    #[test]
    fn a_kept_schema_still_reads_with_bounded_backtracking() {
        let lookahead = json!({"type": "string", "pattern": "^(?=.*[A-Z]).+$"});
        assert!(compile_schema(&lookahead).is_err());
        let kept = compile_kept_schema(&lookahead).unwrap();
        assert!(kept.is_valid(&json!("Secret")) && !kept.is_valid(&json!("secret")));
        let backtracking =
            compile_kept_schema(&json!({"type": "string", "not": {"pattern": r"^(a|a?)+\1b$"}})).unwrap();
        let started = std::time::Instant::now();
        let _ = backtracking.is_valid(&json!("a".repeat(8_000)));
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "bounded: {:?}", started.elapsed());
        let many: serde_json::Map<String, Value> =
            (0..40).map(|index| (format!("p{index}"), json!({"pattern": format!("^x{index}$")}))).collect();
        let many = json!({"properties": many});
        assert!(compile_schema(&many).is_err());
        assert!(compile_kept_schema(&many).is_ok());
        assert!(compile_kept_schema(&json!({"pattern": "(.{100}){100}N"})).is_err(), "size limits hold for both");
    }

    #[test]
    fn references_may_not_recurse_or_expand_past_the_limit() {
        let mut defs = serde_json::Map::new();
        for level in 0..25 {
            let next = json!({"$ref": format!("#/$defs/d{}", level + 1)});
            defs.insert(format!("d{level}"), json!({"anyOf": [next.clone(), next]}));
        }
        defs.insert("d25".into(), json!({"type": "string"}));
        let exploding = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        for compile in [compile_schema, compile_kept_schema] {
            assert!(compile(&exploding).unwrap_err().contains("expand it past 100000"));
        }
        let recursive =
            json!({"$defs": {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}, "$ref": "#/$defs/tree"});
        assert!(compile_schema(&recursive).unwrap_err().contains("may not recurse"));
        assert!(compile_schema(&json!({"items": {"$ref": "#"}})).unwrap_err().contains("may not recurse"));
        assert!(compile_schema(&json!({"$ref": "https://example.com/s.json"})).unwrap_err().contains("JSON Pointer"));
        let chain: serde_json::Map<String, Value> = (0..40)
            .map(|level| (format!("d{level}"), json!({"$ref": format!("#/$defs/d{}", level + 1)})))
            .chain([("d40".to_owned(), json!({"type": "string"}))])
            .collect();
        let chain = json!({"$defs": chain, "$ref": "#/$defs/d0"});
        assert!(compile_schema(&chain).unwrap_err().contains("more than 32"));
        // An `$id` below the root would make `#/items` read from there.
        let moved = json!({"items": {"type": "string"}, "properties": {"t": {"$ref": "#/$defs/tree"}},
            "$defs": {"tree": {"$id": "https://e.example/tree", "type": "array",
                "items": {"anyOf": [{"$ref": "#/items"}, {"$ref": "#/items"}]}}}});
        assert!(compile_kept_schema(&moved).unwrap_err().contains("`$id` below its root"));
        // Names and values are not keywords; a pointer may be percent-encoded.
        let named = json!({"type": "object", "properties": {"$ref": {"type": "string"}, "pattern": {"const": {"$ref": 1}}},
            "definitions": {"List<Item>": {"type": "array"}}, "additionalProperties": {"$ref": "#/definitions/List%3CItem%3E"}});
        assert!(compile_kept_schema(&named).is_ok(), "{:?}", compile_kept_schema(&named).err());
        // What generated schemas usually do: shared definitions, no recursion.
        let usual = json!({"type": "object", "$defs": {"repo": {"type": "string", "pattern": "^[a-z]+/[a-z]+$"}},
            "properties": {"from": {"$ref": "#/$defs/repo"}, "to": {"$ref": "#/$defs/repo"}}});
        let usual = compile_schema(&usual).unwrap();
        assert!(usual.is_valid(&json!({"from": "a/b", "to": "c/d"})) && !usual.is_valid(&json!({"from": "A"})));
    }

    #[test]
    fn a_schema_is_compiled_once() {
        let schema = json!({"type": "string", "pattern": "^once-[0-9]+$"});
        let first = compile_schema(&schema).unwrap();
        let again = compile_schema(&json!({"pattern": "^once-[0-9]+$", "type": "string"})).unwrap();
        assert!(Arc::ptr_eq(&first.0, &again.0), "the same schema, keys in another order, is the same validator");
        // Numbers a double would round together are two schemas, not one.
        let one = compile_schema(&json!({"const": 12345678901234567891u64})).unwrap();
        let other = compile_schema(&json!({"const": 12345678901234567890u64})).unwrap();
        assert!(!Arc::ptr_eq(&one.0, &other.0));
        assert!(other.is_valid(&json!(12345678901234567890u64)) && !other.is_valid(&json!(12345678901234567891u64)));
    }
}
