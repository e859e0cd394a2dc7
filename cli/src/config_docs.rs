//! `docs/configuration.md` against the program: every key the server's file
//! accepts, and every flag of `server` and `agent run` with its variable and
//! default, must be on the page, and the page must name nothing else.
//!
//! The file's keys are read from the types themselves: a probing
//! deserializer follows one path into `FileConfig` at a time and records the
//! field names serde's derive hands it, so a field added to any section (or
//! to the catalog's types) shows up here without a list to keep.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

const PAGE: &str = include_str!("../../docs/configuration.md");

/// Why a probe stopped: it always does, once it has looked.
#[derive(Debug)]
struct Stop;

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("probe stopped")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Stop
    }
}

/// What sits at the end of a route.
#[derive(Debug, Clone)]
enum Shape {
    Struct(&'static [&'static str]),
    List,
    /// A value, or a map with free keys (`fallbacks`, `env`): documented
    /// as one key.
    Leaf,
}

/// Follows `route` (field names, `[]` for a list's element) and records the
/// shape found at its end.
struct Probe<'a> {
    route: &'a [String],
    found: &'a RefCell<Option<Shape>>,
}

impl Probe<'_> {
    fn end(&self, shape: Shape) -> Result<(), Stop> {
        if self.route.is_empty() {
            *self.found.borrow_mut() = Some(shape);
        }
        Err(Stop)
    }
}

macro_rules! leaf {
    ($($name:ident)*) => {$(
        fn $name<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            self.end(Shape::Leaf).map(|()| unreachable!())
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = Stop;

    leaf! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16
        deserialize_i32 deserialize_i64 deserialize_u8 deserialize_u16
        deserialize_u32 deserialize_u64 deserialize_f32 deserialize_f64
        deserialize_char deserialize_str deserialize_string deserialize_bytes
        deserialize_byte_buf deserialize_unit deserialize_map
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        v.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, Stop> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: V,
    ) -> Result<V::Value, Stop> {
        self.end(Shape::Leaf).map(|()| unreachable!())
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Stop> {
        self.end(Shape::Leaf).map(|()| unreachable!())
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        _: V,
    ) -> Result<V::Value, Stop> {
        self.end(Shape::Leaf).map(|()| unreachable!())
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        self.end(Shape::Leaf).map(|()| unreachable!())
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        match self.route.split_first() {
            None => self.end(Shape::List).map(|()| unreachable!()),
            Some((next, rest)) if next == "[]" => v.visit_seq(One {
                key: None,
                value: Some(Probe {
                    route: rest,
                    found: self.found,
                }),
            }),
            Some(_) => Err(Stop),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Stop> {
        match self.route.split_first() {
            None => self.end(Shape::Struct(fields)).map(|()| unreachable!()),
            Some((next, rest)) if fields.contains(&next.as_str()) => v.visit_map(One {
                key: Some(next.as_str()),
                value: Some(Probe {
                    route: rest,
                    found: self.found,
                }),
            }),
            Some(_) => Err(Stop),
        }
    }
}

/// A map of one entry, or a list of one element.
struct One<'a> {
    key: Option<&'a str>,
    value: Option<Probe<'a>>,
}

impl<'de> MapAccess<'de> for One<'_> {
    type Error = Stop;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Stop> {
        match self.key.take() {
            Some(k) => seed.deserialize(k.into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Stop> {
        seed.deserialize(self.value.take().ok_or(Stop)?)
    }
}

impl<'de> SeqAccess<'de> for One<'_> {
    type Error = Stop;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Stop> {
        match self.value.take() {
            Some(p) => seed.deserialize(p).map(Some),
            None => Ok(None),
        }
    }
}

/// Every leaf key of `T`, as `a.b`, `models[].name`.
fn keys<T: for<'de> Deserialize<'de>>() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut routes: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(route) = routes.pop() {
        let found = RefCell::new(None);
        let _ = T::deserialize(Probe {
            route: &route,
            found: &found,
        });
        let shape = found.into_inner();
        match shape {
            Some(Shape::Struct(fields)) => {
                for f in fields {
                    let mut r = route.clone();
                    r.push((*f).to_owned());
                    routes.push(r);
                }
            }
            Some(Shape::List) => {
                let mut r = route.clone();
                r.push("[]".into());
                routes.push(r);
            }
            // A list of plain values is one key (`aliases`).
            Some(Shape::Leaf) | None => {
                let name = route.join(".").replace(".[]", "[]");
                out.insert(name.trim_end_matches("[]").to_owned());
            }
        }
    }
    out
}

/// The first cell of every table row in the part of the page under
/// `heading`, as written between backticks.
fn rows(heading: &str) -> Vec<Vec<String>> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in PAGE.lines() {
        if line.starts_with("## ") {
            inside = line == heading;
            continue;
        }
        if !inside || !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<String> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_owned())
            .collect();
        out.push(cells);
    }
    out
}

fn unquote(cell: &str) -> String {
    cell.trim_matches('`').to_owned()
}

fn differences(what: &str, program: &BTreeSet<String>, page: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for k in program.difference(page) {
        out.push(format!("{what} {k} is not in docs/configuration.md"));
    }
    for k in page.difference(program) {
        out.push(format!(
            "docs/configuration.md names {what} {k}, which does not exist"
        ));
    }
    out
}

#[test]
fn every_file_key_is_documented_and_every_documented_key_exists() {
    let program = keys::<super::FileConfig>();
    assert!(
        program.contains("control.lease_ttl") && program.contains("models[].profiles[].engine"),
        "the probe found too little: {program:?}"
    );
    let page: BTreeSet<String> = rows("## The server's file, every key")
        .iter()
        .map(|r| unquote(&r[0]))
        .collect();
    let wrong = differences("the key", &program, &page);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_pages_full_example_is_accepted_as_it_stands() {
    let start = PAGE.find("```yaml\n").expect("the page has a YAML block") + 8;
    let len = PAGE[start..].find("```").expect("the block ends");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.yaml");
    std::fs::write(&file, &PAGE[start..start + len]).unwrap();
    if let Err(e) = super::load(Some(&file), &[]) {
        panic!("the example in docs/configuration.md is refused: {e}");
    }
}

/// A command's flags as the page lists them: `--flag` → (variable,
/// default), from the table under `heading`.
fn flags_on_page(heading: &str) -> std::collections::BTreeMap<String, (String, String)> {
    rows(heading)
        .into_iter()
        .map(|r| (unquote(&r[0]), (unquote(&r[1]), unquote(&r[2]))))
        .collect()
}

fn check_flags(cmd: &clap::Command, heading: &str) -> Vec<String> {
    let page = flags_on_page(heading);
    let mut wrong = Vec::new();
    let mut program = BTreeSet::new();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() || arg.is_global_set() || long == "help" || long == "version" {
            continue;
        }
        let flag = format!("--{long}");
        program.insert(flag.clone());
        let Some((var, default)) = page.get(&flag) else {
            continue;
        };
        // A switch's implied `false` is not a default worth writing down.
        let switch = !arg.get_action().takes_values();
        let env = arg
            .get_env()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_default();
        if *var != env {
            wrong.push(format!(
                "{flag}: the page says variable {var:?}, the program {env:?}"
            ));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        if let [d] = defaults.as_slice()
            && !switch
            && d != default
        {
            wrong.push(format!(
                "{flag}: the page says default {default:?}, the program {d:?}"
            ));
        }
    }
    let page: BTreeSet<String> = page.into_keys().collect();
    wrong.extend(differences("the flag", &program, &page));
    wrong
}

#[test]
fn every_flag_of_server_and_agent_is_documented_with_its_variable_and_default() {
    use clap::CommandFactory;
    let cli = crate::Cli::command();
    let server = cli.find_subcommand("server").expect("llmgw server");
    let agent = cli
        .find_subcommand("agent")
        .and_then(|a| a.find_subcommand("run"))
        .expect("llmgw agent run");
    let mut wrong = check_flags(server, "## The server's flags");
    wrong.extend(check_flags(agent, "## The agent's flags"));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
