//! Argument parsing (`doca_argp.h`): the program registers flags with callbacks, `start` parses
//! the command line (or a JSON file given with `-j`) and calls each flag's callback with its
//! value and the program's configuration.
//!
//! Besides the program's flags every program takes DOCA's: `-h/--help`, `-v/--version`,
//! `-l/--log-level`, `--sdk-log-level` and `-j/--json`. Values are strings, integers, booleans
//! (a flag without a value on the command line) and doubles; device and representor flags need
//! hardware and are refused when registered. Flags come as `-d VALUE`, `-dVALUE`,
//! `--device VALUE` or `--device=VALUE`. A JSON file holds an object keyed by long names, either
//! flat or in DOCA's `doca_general_flags` / `doca_program_flags` sections; the command line wins
//! over it.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Mutex, MutexGuard};

use urom_capi_abi::{DocaError, Status};

use crate::{ffi, log};

/// Marks a live parameter.
pub(crate) const PARAM_MAGIC: u64 = 0x7572_6f6d_6172_6770; // "uromargp"

/// `doca_argp_param_cb_t`.
pub(crate) type ParamCb =
    unsafe extern "C" fn(param: *mut c_void, config: *mut c_void) -> DocaError;
/// `doca_argp_validation_cb_t`.
pub(crate) type ValidationCb = unsafe extern "C" fn(config: *mut c_void) -> DocaError;

/// `enum doca_argp_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    String,
    Int,
    Boolean,
    Double,
}

impl Kind {
    /// From the C value: 1 string, 2 int, 3 boolean, 6 double; devices (4, 5) and unknown
    /// types are not supported.
    pub(crate) fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::String),
            2 => Some(Self::Int),
            3 => Some(Self::Boolean),
            6 => Some(Self::Double),
            _ => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Int => "integer",
            Self::Boolean => "boolean",
            Self::Double => "number",
        }
    }
}

/// `struct doca_argp_param`.
#[derive(Debug, Default)]
pub struct ParamObj {
    pub(crate) magic: u64,
    pub(crate) short: Option<String>,
    pub(crate) long: Option<String>,
    pub(crate) arguments: Option<String>,
    pub(crate) description: Option<String>,
    pub(crate) callback: Option<ParamCb>,
    /// The raw `enum doca_argp_type`.
    pub(crate) kind: u32,
    pub(crate) mandatory: bool,
    pub(crate) cli_only: bool,
    pub(crate) multiplicity: bool,
}

impl ParamObj {
    pub(crate) fn new() -> Box<Self> {
        Box::new(Self {
            magic: PARAM_MAGIC,
            ..Self::default()
        })
    }

    /// The parameter, if `param` points to a live one.
    pub(crate) fn check(param: Option<&mut Self>) -> Option<&mut Self> {
        param.filter(|param| param.magic == PARAM_MAGIC)
    }

    fn name(&self) -> String {
        match (&self.short, &self.long) {
            (_, Some(long)) => format!("--{long}"),
            (Some(short), None) => format!("-{short}"),
            (None, None) => "(unnamed)".into(),
        }
    }
}

struct Argp {
    program: Option<String>,
    config: usize,
    params: Vec<ParamObj>,
    validation: Option<ValidationCb>,
    version: Option<ParamCb>,
}

static ARGP: Mutex<Option<Argp>> = Mutex::new(None);

fn argp() -> MutexGuard<'static, Option<Argp>> {
    ARGP.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `doca_argp_init()`.
pub(crate) fn init(program: Option<String>, config: usize) -> Result<(), Status> {
    let mut argp = argp();
    if argp.is_some() {
        return Err(Status::BadState);
    }
    *argp = Some(Argp {
        program,
        config,
        params: Vec::new(),
        validation: None,
        version: None,
    });
    Ok(())
}

/// `doca_argp_destroy()`.
pub(crate) fn destroy() -> Result<(), Status> {
    argp().take().map(|_| ()).ok_or(Status::BadState)
}

pub(crate) fn initialized() -> bool {
    argp().is_some()
}

const BUILTIN_SHORT: [&str; 3] = ["h", "v", "l"];
const BUILTIN_LONG: [&str; 5] = ["help", "version", "log-level", "sdk-log-level", "json"];

/// `doca_argp_register_param()`: takes the parameter in every case.
pub(crate) fn register(param: ParamObj) -> Result<(), Status> {
    let mut guard = argp();
    let argp = guard.as_mut().ok_or(Status::BadState)?;
    let name = param.name();
    if (param.short.is_none() && param.long.is_none())
        || param.description.is_none()
        || param.callback.is_none()
    {
        log::sdk(
            log::ERROR,
            "argp",
            &format!("flag {name} lacks a name, a description or a callback"),
        );
        return Err(Status::Initialization);
    }
    if Kind::from_raw(param.kind).is_none() {
        log::sdk(
            log::ERROR,
            "argp",
            &format!(
                "flag {name}: type {} is not supported (string, int, boolean and double are)",
                param.kind
            ),
        );
        return Err(Status::NotSupported);
    }
    let clash = |other: &ParamObj| {
        (param.short.is_some() && param.short == other.short)
            || (param.long.is_some() && param.long == other.long)
    };
    let builtin = param
        .short
        .as_deref()
        .is_some_and(|s| BUILTIN_SHORT.contains(&s))
        || param
            .long
            .as_deref()
            .is_some_and(|l| BUILTIN_LONG.contains(&l));
    if builtin || argp.params.iter().any(clash) {
        log::sdk(
            log::ERROR,
            "argp",
            &format!("flag {name} is already registered"),
        );
        return Err(Status::InvalidValue);
    }
    argp.params.push(param);
    Ok(())
}

pub(crate) fn set_validation(cb: ValidationCb) -> Result<(), Status> {
    argp().as_mut().ok_or(Status::BadState)?.validation = Some(cb);
    Ok(())
}

pub(crate) fn set_version(cb: ParamCb) -> Result<(), Status> {
    argp().as_mut().ok_or(Status::BadState)?.version = Some(cb);
    Ok(())
}

/// A flag's value, as its callback receives it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Str(CString),
    Int(i32),
    Bool(bool),
    Double(f64),
}

/// A callback to run once parsing is done.
struct Call {
    callback: ParamCb,
    name: String,
    value: Value,
}

/// What the command line asks of DOCA's own flags.
#[derive(Debug, Default, PartialEq)]
struct Builtins {
    help: bool,
    version: bool,
    log_level: Option<u32>,
    sdk_log_level: Option<u32>,
    json: Option<String>,
}

fn parse_value(kind: Kind, text: &str) -> Result<Value, String> {
    match kind {
        Kind::String => CString::new(text)
            .map(Value::Str)
            .map_err(|_| "a string without NUL bytes".into()),
        Kind::Int => {
            let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
                Some(hex) => i64::from_str_radix(hex, 16),
                None => text.parse::<i64>(),
            };
            parsed
                .ok()
                .and_then(|v| i32::try_from(v).ok())
                .map(Value::Int)
                .ok_or_else(|| "an integer".into())
        }
        Kind::Double => text
            .parse::<f64>()
            .map(Value::Double)
            .map_err(|_| "a number".into()),
        Kind::Boolean => match text {
            "true" | "1" | "yes" => Ok(Value::Bool(true)),
            "false" | "0" | "no" => Ok(Value::Bool(false)),
            _ => Err("true or false".into()),
        },
    }
}

fn json_value(kind: Kind, value: &serde_json::Value) -> Result<Value, String> {
    match (kind, value) {
        (Kind::String, serde_json::Value::String(s)) => parse_value(kind, s),
        (Kind::Int, serde_json::Value::Number(n)) => n
            .as_i64()
            .and_then(|v| i32::try_from(v).ok())
            .map(Value::Int)
            .ok_or_else(|| "an integer".into()),
        (Kind::Double, serde_json::Value::Number(n)) => n
            .as_f64()
            .map(Value::Double)
            .ok_or_else(|| "a number".into()),
        (Kind::Boolean, serde_json::Value::Bool(b)) => Ok(Value::Bool(*b)),
        (kind, _) => Err(format!("a {}", kind.label())),
    }
}

fn level_value(text: &str, flag: &str) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|&l| log::valid_level(l))
        .ok_or_else(|| format!("{flag} takes a level: 10, 20, 30, 40, 50, 60 or 70, not `{text}`"))
}

/// The flags of `args` (without the program name): DOCA's own and the callbacks to run.
fn parse_cli(
    params: &[ParamObj],
    args: &[String],
) -> Result<(Builtins, Vec<(usize, Value)>), String> {
    let mut builtins = Builtins::default();
    let mut found = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        // (name as typed, inline value, is long)
        let (name, inline, long) = if let Some(rest) = arg.strip_prefix("--") {
            match rest.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned()), true),
                None => (rest.to_owned(), None, true),
            }
        } else if let Some(rest) = arg.strip_prefix('-').filter(|r| !r.is_empty()) {
            let mut chars = rest.chars();
            let first = chars.next().map(String::from).unwrap_or_default();
            let tail: String = chars.collect();
            (first, (!tail.is_empty()).then_some(tail), false)
        } else {
            return Err(format!("unexpected argument `{arg}`"));
        };
        let mut take_value = |what: &str| -> Result<String, String> {
            if let Some(value) = inline.clone() {
                return Ok(value);
            }
            let value = args
                .get(i)
                .cloned()
                .ok_or_else(|| format!("{what} needs a value"))?;
            i += 1;
            Ok(value)
        };
        let is = |short: &str, long_name: &str| {
            if long {
                name == long_name
            } else {
                name == short
            }
        };
        if is("h", "help") {
            builtins.help = true;
        } else if is("v", "version") {
            builtins.version = true;
        } else if is("l", "log-level") {
            builtins.log_level = Some(level_value(&take_value(arg)?, "--log-level")?);
        } else if long && name == "sdk-log-level" {
            builtins.sdk_log_level = Some(level_value(&take_value(arg)?, "--sdk-log-level")?);
        } else if is("j", "json") {
            builtins.json = Some(take_value(arg)?);
        } else {
            let index = params
                .iter()
                .position(|p| {
                    if long {
                        p.long.as_deref() == Some(name.as_str())
                    } else {
                        p.short.as_deref() == Some(name.as_str())
                    }
                })
                .ok_or_else(|| format!("unknown flag `{arg}`"))?;
            let kind = Kind::from_raw(params[index].kind).ok_or("unsupported flag type")?;
            let value = if kind == Kind::Boolean && inline.is_none() {
                Value::Bool(true)
            } else {
                let text = take_value(arg)?;
                parse_value(kind, &text)
                    .map_err(|want| format!("{arg} takes {want}, not `{text}`"))?
            };
            found.push((index, value));
        }
    }
    Ok((builtins, found))
}

/// The flags of a JSON file: `(index, value)` for the program's, and DOCA's log levels.
fn parse_json(params: &[ParamObj], path: &str) -> Result<(Builtins, Vec<(usize, Value)>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let root: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{path} is not JSON: {e}"))?;
    let serde_json::Value::Object(root) = root else {
        return Err(format!("{path} does not hold a JSON object"));
    };
    let mut entries: Vec<(String, serde_json::Value)> = Vec::new();
    for (key, value) in root {
        match value {
            serde_json::Value::Object(section) => entries.extend(section),
            value => entries.push((key, value)),
        }
    }
    let mut builtins = Builtins::default();
    let mut found = Vec::new();
    for (key, value) in entries {
        if key == "log-level" || key == "sdk-log-level" {
            let level = value
                .as_u64()
                .and_then(|l| u32::try_from(l).ok())
                .filter(|&l| log::valid_level(l))
                .ok_or_else(|| format!("{path}: {key} takes a level (10 to 70)"))?;
            if key == "log-level" {
                builtins.log_level = Some(level);
            } else {
                builtins.sdk_log_level = Some(level);
            }
            continue;
        }
        let index = params
            .iter()
            .position(|p| p.long.as_deref() == Some(key.as_str()))
            .ok_or_else(|| format!("{path}: unknown flag `{key}`"))?;
        if params[index].cli_only {
            return Err(format!(
                "{path}: `{key}` may only be given on the command line"
            ));
        }
        let kind = Kind::from_raw(params[index].kind).ok_or("unsupported flag type")?;
        let values = match &value {
            serde_json::Value::Array(items) if params[index].multiplicity => items.clone(),
            _ => vec![value],
        };
        for item in &values {
            let value =
                json_value(kind, item).map_err(|want| format!("{path}: `{key}` takes {want}"))?;
            found.push((index, value));
        }
    }
    Ok((builtins, found))
}

/// The usage text.
fn usage_text(argp: &Argp) -> String {
    let mut text = format!(
        "Usage: {} [DOCA Flags] [Program Flags]\n\nDOCA Flags:\n",
        argp.program.as_deref().unwrap_or("program")
    );
    let line = |flags: String, description: &str| format!("  {flags:<38}{description}\n");
    text += &line("-h, --help".into(), "Print a help synopsis");
    text += &line("-v, --version".into(), "Print program version information");
    text += &line(
        "-l, --log-level".into(),
        "Set the (numeric) log level for the program <10=DISABLE, 20=CRITICAL, 30=ERROR, 40=WARNING, 50=INFO, 60=DEBUG, 70=TRACE>",
    );
    text += &line(
        "--sdk-log-level".into(),
        "Set the SDK (numeric) log level for the program <10=DISABLE, 20=CRITICAL, 30=ERROR, 40=WARNING, 50=INFO, 60=DEBUG, 70=TRACE>",
    );
    text += &line(
        "-j, --json <path>".into(),
        "Parse all command flags from an input json file",
    );
    if !argp.params.is_empty() {
        text += "\nProgram Flags:\n";
    }
    for param in &argp.params {
        let mut flags = match (&param.short, &param.long) {
            (Some(s), Some(l)) => format!("-{s}, --{l}"),
            (Some(s), None) => format!("-{s}"),
            (None, Some(l)) => format!("--{l}"),
            (None, None) => String::new(),
        };
        if let Some(arguments) = &param.arguments {
            flags = format!("{flags} {arguments}");
        }
        let mut description = param.description.clone().unwrap_or_default();
        if param.mandatory {
            description += " (required)";
        }
        text += &line(flags, &description);
    }
    text
}

/// `doca_argp_usage()`.
pub(crate) fn usage() {
    if let Some(argp) = argp().as_ref() {
        print!("{}", usage_text(argp));
    }
}

/// `doca_argp_start()`.
pub(crate) fn start(args: &[String]) -> Result<(), Status> {
    let fail = |message: String, status: Status| {
        log::sdk(log::ERROR, "argp", &message);
        status
    };
    let (calls, config, validation, version, builtins, usage) = {
        let mut guard = argp();
        let argp = guard.as_mut().ok_or(Status::BadState)?;
        if argp.program.is_none() {
            argp.program = args
                .first()
                .map(|p| p.rsplit('/').next().unwrap_or(p).to_owned());
        }
        let rest = args.get(1..).unwrap_or_default();
        let (builtins, mut found) = parse_cli(&argp.params, rest).map_err(|message| {
            let status = if message.starts_with("unknown flag") {
                Status::NotSupported
            } else {
                Status::InvalidValue
            };
            fail(format!("{message}; see --help"), status)
        })?;
        let mut builtins = builtins;
        if let Some(path) = &builtins.json {
            let (from_json, mut json_found) =
                parse_json(&argp.params, path).map_err(|m| fail(m, Status::IoFailed))?;
            // The command line wins: values from the file first, the same flags given on the
            // command line replace them.
            json_found.retain(|(index, _)| !found.iter().any(|(i, _)| i == index));
            json_found.append(&mut found);
            found = json_found;
            builtins.log_level = builtins.log_level.or(from_json.log_level);
            builtins.sdk_log_level = builtins.sdk_log_level.or(from_json.sdk_log_level);
        }
        let mut counts: HashMap<usize, usize> = HashMap::new();
        for (index, _) in &found {
            *counts.entry(*index).or_default() += 1;
        }
        for (index, param) in argp.params.iter().enumerate() {
            let count = counts.get(&index).copied().unwrap_or(0);
            if count > 1 && !param.multiplicity {
                return Err(fail(
                    format!("flag {} was given {count} times", param.name()),
                    Status::InvalidValue,
                ));
            }
            if count == 0 && param.mandatory && !builtins.help && !builtins.version {
                return Err(fail(
                    format!("flag {} is required; see --help", param.name()),
                    Status::InvalidValue,
                ));
            }
        }
        let calls: Vec<Call> = found
            .into_iter()
            .filter_map(|(index, value)| {
                let param = &argp.params[index];
                param.callback.map(|callback| Call {
                    callback,
                    name: param.name(),
                    value,
                })
            })
            .collect();
        (
            calls,
            argp.config,
            argp.validation,
            argp.version,
            builtins,
            usage_text(argp),
        )
    };
    if builtins.help {
        print!("{usage}");
        ffi::exit(0);
    }
    if builtins.version {
        match version {
            Some(cb) => {
                let status = ffi::call_param_cb(cb, &mut Value::Bool(true), config);
                Status::from_raw(status).into_result()?;
            }
            None => println!(
                "urom DOCA-compatible host library {}",
                env!("CARGO_PKG_VERSION")
            ),
        }
        ffi::exit(0);
    }
    if let Some(level) = builtins.log_level {
        log::set_global_limit(log::Limit::Lower, level)?;
    }
    if let Some(level) = builtins.sdk_log_level {
        log::set_global_sdk(level)?;
    }
    for mut call in calls {
        let status = Status::from_raw(ffi::call_param_cb(call.callback, &mut call.value, config));
        if status != Status::Success {
            return Err(fail(
                format!(
                    "the callback of flag {} failed: {}",
                    call.name,
                    status.name()
                ),
                status,
            ));
        }
    }
    if let Some(validation) = validation {
        let status = Status::from_raw(ffi::call_validation_cb(validation, config));
        if status != Status::Success {
            return Err(fail(
                format!("the program's validation failed: {}", status.name()),
                status,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn nothing(_: *mut c_void, _: *mut c_void) -> DocaError {
        0
    }

    fn param(short: &str, long: &str, kind: u32) -> ParamObj {
        let mut p = *ParamObj::new();
        p.short = Some(short.into());
        p.long = Some(long.into());
        p.description = Some("d".into());
        p.callback = Some(nothing);
        p.kind = kind;
        p
    }

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_in_every_spelling() {
        let params = vec![
            param("d", "device", 1),
            param("n", "count", 2),
            param("f", "fast", 3),
        ];
        let (builtins, found) = parse_cli(
            &params,
            &args(&[
                "-d",
                "mlx5_0",
                "--count=7",
                "-f",
                "-n0x10",
                "--device",
                "x",
                "-l",
                "60",
            ]),
        )
        .unwrap();
        assert_eq!(builtins.log_level, Some(60));
        let expected = vec![
            (0, Value::Str(CString::new("mlx5_0").unwrap())),
            (1, Value::Int(7)),
            (2, Value::Bool(true)),
            (1, Value::Int(16)),
            (0, Value::Str(CString::new("x").unwrap())),
        ];
        assert_eq!(found, expected);
        assert!(
            parse_cli(&params, &args(&["--nope"]))
                .unwrap_err()
                .contains("unknown flag")
        );
        assert!(
            parse_cli(&params, &args(&["-n", "seven"]))
                .unwrap_err()
                .contains("integer")
        );
        assert!(
            parse_cli(&params, &args(&["-d"]))
                .unwrap_err()
                .contains("needs a value")
        );
        assert!(
            parse_cli(&params, &args(&["-l", "45"]))
                .unwrap_err()
                .contains("level")
        );
    }

    #[test]
    fn json_files_flat_or_in_sections() {
        let dir = std::env::temp_dir().join(format!("urom-argp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("flags.json");
        std::fs::write(
            &path,
            r#"{"doca_general_flags": {"log-level": 40}, "doca_program_flags": {"device": "mlx5_1"}, "count": 3}"#,
        )
        .unwrap();
        let params = vec![param("d", "device", 1), param("n", "count", 2)];
        let (builtins, found) = parse_json(&params, path.to_str().unwrap()).unwrap();
        assert_eq!(builtins.log_level, Some(40));
        assert_eq!(found.len(), 2);
        assert!(found.contains(&(0, Value::Str(CString::new("mlx5_1").unwrap()))));
        assert!(found.contains(&(1, Value::Int(3))));
        std::fs::write(&path, r#"{"count": "three"}"#).unwrap();
        assert!(
            parse_json(&params, path.to_str().unwrap())
                .unwrap_err()
                .contains("integer")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
