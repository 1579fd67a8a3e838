//! `shoal screen ID -o FILE.png` and `shoal input ID EVENT...`: the
//! display of a `vm` sandbox (QEMU q35) through shoald.

use crate::daemon_client::connect;
use crate::daemon_cmds::Global;
use anyhow::{bail, ensure, Context, Result};
use shoal_client::api::{InputEvent, MAX_INPUT_EVENTS, POINTER_MAX};
use std::io::Write;
use std::path::PathBuf;

/// `shoal screen`.
#[derive(clap::Args, Debug)]
pub struct ScreenArgs {
    /// Sandbox id (a `vm` sandbox: `shoal template create --kind vm`).
    pub id: String,
    /// Where to write the PNG (`-`: standard output).
    #[arg(long, short = 'o', default_value = "screen.png")]
    pub out: PathBuf,
}

/// `shoal input`.
#[derive(clap::Args, Debug)]
pub struct InputArgs {
    /// Sandbox id (a `vm` sandbox).
    pub id: String,
    /// Events, sent in order: `key:NAME` (a press: down then up;
    /// `key:ctrl+alt+f1` holds the modifiers), `down:NAME`, `up:NAME`
    /// (NAME: a QEMU key code name: a, 1, ret, spc, shift, ctrl, f1, esc,
    /// tab, backspace, up...), `type:TEXT` (US layout), `move:X,Y` (the
    /// pointer, 0..32767 across each axis), `click:BUTTON`,
    /// `press:BUTTON`, `release:BUTTON` (left, middle, right, wheel-up,
    /// wheel-down).
    #[arg(required = true, value_parser = parse_event, value_name = "EVENT")]
    pub events: Vec<Events>,
}

/// The events one argument stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Events(pub Vec<InputEvent>);

const BUTTONS: [&str; 5] = ["left", "middle", "right", "wheel-up", "wheel-down"];

fn key_name(k: &str) -> Result<String> {
    ensure!(
        (1..=24).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
        "key {k:?}: expected a QEMU key code name (a, ret, shift, f1, ...)"
    );
    Ok(k.into())
}

fn key(k: &str, down: bool) -> Result<InputEvent> {
    Ok(InputEvent::Key {
        key: key_name(k)?,
        down,
    })
}

/// A press of `k` with `mods` held.
fn press(k: &str, mods: &[&str]) -> Result<Vec<InputEvent>> {
    let mut v = vec![];
    for m in mods {
        v.push(key(m, true)?);
    }
    v.push(key(k, true)?);
    v.push(key(k, false)?);
    for m in mods.iter().rev() {
        v.push(key(m, false)?);
    }
    Ok(v)
}

fn button(b: &str, down: bool) -> Result<InputEvent> {
    ensure!(
        BUTTONS.contains(&b),
        "button {b:?}: expected one of {}",
        BUTTONS.join(", ")
    );
    Ok(InputEvent::Button {
        button: b.into(),
        down,
    })
}

/// The key (and whether shift) that types `c` on a US layout.
fn char_key(c: char) -> Option<(String, bool)> {
    const PLAIN: [(char, &str); 14] = [
        (' ', "spc"),
        ('\n', "ret"),
        ('\t', "tab"),
        ('-', "minus"),
        ('=', "equal"),
        (',', "comma"),
        ('.', "dot"),
        ('/', "slash"),
        (';', "semicolon"),
        ('\'', "apostrophe"),
        ('[', "bracket_left"),
        (']', "bracket_right"),
        ('\\', "backslash"),
        ('`', "grave_accent"),
    ];
    const SHIFTED: &str = "_+<>?:\"{}|~";
    const SHIFTED_OF: &str = "-=,./;'[]\\`";
    const DIGIT_SHIFTED: &str = "!@#$%^&*()";
    if c.is_ascii_lowercase() || c.is_ascii_digit() {
        return Some((c.into(), false));
    }
    if c.is_ascii_uppercase() {
        return Some((c.to_ascii_lowercase().into(), true));
    }
    if let Some((_, k)) = PLAIN.iter().find(|(p, _)| *p == c) {
        return Some(((*k).into(), false));
    }
    if let Some(i) = SHIFTED.chars().position(|s| s == c) {
        let base = SHIFTED_OF.chars().nth(i)?;
        return char_key(base).map(|(k, _)| (k, true));
    }
    let i = DIGIT_SHIFTED.chars().position(|s| s == c)?;
    Some(("1234567890".chars().nth(i)?.into(), true))
}

/// Parses one `EVENT` argument.
pub fn parse_event(s: &str) -> Result<Events> {
    let (kind, arg) = s
        .split_once(':')
        .with_context(|| format!("{s:?}: expected KIND:VALUE (key:ret, move:100,200, ...)"))?;
    let v = match kind {
        "key" => {
            let parts: Vec<&str> = arg.split('+').collect();
            let (k, mods) = parts.split_last().context("key: no key")?;
            press(k, mods)?
        }
        "down" => vec![key(arg, true)?],
        "up" => vec![key(arg, false)?],
        "type" => {
            ensure!(!arg.is_empty(), "type: no text");
            let mut v = vec![];
            for c in arg.chars() {
                let (k, shift) =
                    char_key(c).with_context(|| format!("cannot type {c:?} on a US layout"))?;
                v.extend(press(&k, if shift { &["shift"] } else { &[] })?);
            }
            v
        }
        "move" => {
            let (x, y) = arg
                .split_once(',')
                .context("move: expected X,Y (0..32767 each)")?;
            let n = |t: &str| -> Result<u32> {
                t.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|v| *v <= POINTER_MAX)
                    .with_context(|| format!("move: {t:?} is not 0..{POINTER_MAX}"))
            };
            vec![InputEvent::Move { x: n(x)?, y: n(y)? }]
        }
        "click" => vec![button(arg, true)?, button(arg, false)?],
        "press" => vec![button(arg, true)?],
        "release" => vec![button(arg, false)?],
        other => bail!(
            "event kind {other:?}: expected key, down, up, type, move, click, press or release"
        ),
    };
    Ok(Events(v))
}

/// (width, height) of a PNG.
fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[12..16] != b"IHDR" {
        return None;
    }
    let be = |b: &[u8]| b.try_into().ok().map(u32::from_be_bytes);
    Some((be(&png[16..20])?, be(&png[20..24])?))
}

/// `shoal screen ID -o FILE`.
pub fn screen(g: &Global, a: &ScreenArgs) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let png = c.screen(&a.id)?;
    if a.out.as_os_str() == "-" {
        std::io::stdout().write_all(&png)?;
        return Ok(0);
    }
    std::fs::write(&a.out, &png).with_context(|| format!("cannot write {}", a.out.display()))?;
    let size = png_size(&png).map_or("?".into(), |(w, h)| format!("{w}x{h}"));
    eprintln!("wrote {} ({size}, {} bytes)", a.out.display(), png.len());
    Ok(0)
}

/// `shoal input ID EVENT...`: sent in requests of at most 256 events.
pub fn input(g: &Global, a: &InputArgs) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let all: Vec<InputEvent> = a.events.iter().flat_map(|e| e.0.clone()).collect();
    for chunk in all.chunks(MAX_INPUT_EVENTS) {
        c.input(&a.id, chunk)?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn k(key: &str, down: bool) -> InputEvent {
        InputEvent::Key {
            key: key.into(),
            down,
        }
    }

    #[test]
    fn keys_with_modifiers() {
        assert_eq!(
            parse_event("key:ret").unwrap().0,
            vec![k("ret", true), k("ret", false)]
        );
        assert_eq!(
            parse_event("key:ctrl+alt+f1").unwrap().0,
            vec![
                k("ctrl", true),
                k("alt", true),
                k("f1", true),
                k("f1", false),
                k("alt", false),
                k("ctrl", false)
            ]
        );
        assert_eq!(parse_event("down:shift").unwrap().0, vec![k("shift", true)]);
        assert_eq!(parse_event("up:shift").unwrap().0, vec![k("shift", false)]);
        for bad in ["key:", "key:Ret", "key:a;quit", "down:", "key:ctrl+"] {
            assert!(parse_event(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn typing() {
        let downs = |s: &str| -> Vec<String> {
            parse_event(s)
                .unwrap()
                .0
                .into_iter()
                .filter_map(|e| match e {
                    InputEvent::Key { key, down: true } => Some(key),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(downs("type:aB1 "), ["a", "shift", "b", "1", "spc"]);
        assert_eq!(
            downs("type:!_|"),
            ["shift", "1", "shift", "minus", "shift", "backslash"]
        );
        assert_eq!(downs("type:a:b"), ["a", "shift", "semicolon", "b"]);
        assert!(parse_event("type:").is_err());
        let e = parse_event("type:é").unwrap_err();
        assert!(format!("{e:#}").contains("US layout"), "{e:#}");
    }

    #[test]
    fn pointer() {
        assert_eq!(
            parse_event("move:0,32767").unwrap().0,
            vec![InputEvent::Move { x: 0, y: 32767 }]
        );
        for bad in ["move:1", "move:1,32768", "move:-1,2", "move:a,b"] {
            assert!(parse_event(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_event("click:right").unwrap().0.len(), 2);
        assert_eq!(
            parse_event("press:wheel-up").unwrap().0,
            vec![InputEvent::Button {
                button: "wheel-up".into(),
                down: true
            }]
        );
        assert!(parse_event("click:thumb").is_err());
        assert!(parse_event("scroll:1").is_err());
        assert!(parse_event("ret").is_err());
    }

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        c: C,
    }

    #[derive(clap::Subcommand)]
    enum C {
        Screen(ScreenArgs),
        Input(InputArgs),
    }

    #[test]
    fn command_lines() {
        let Cli { c: C::Screen(s) } =
            Cli::try_parse_from(["shoal", "screen", "abc", "-o", "/tmp/x.png"]).unwrap()
        else {
            panic!("not screen")
        };
        assert_eq!((s.id.as_str(), s.out.to_str()), ("abc", Some("/tmp/x.png")));
        let Cli { c: C::Input(i) } =
            Cli::try_parse_from(["shoal", "input", "abc", "type:ls", "key:ret", "move:1,2"])
                .unwrap()
        else {
            panic!("not input")
        };
        assert_eq!((i.id.as_str(), i.events.len()), ("abc", 3));
        assert_eq!(i.events[0].0.len(), 4);
        // No event, or a bad one, is a usage error.
        assert!(Cli::try_parse_from(["shoal", "input", "abc"]).is_err());
        assert!(Cli::try_parse_from(["shoal", "input", "abc", "key:A"]).is_err());
    }

    #[test]
    fn the_shoal_command_line() {
        use crate::{Cli, Cmd, TemplateCmd};
        let c = Cli::try_parse_from([
            "shoal", "template", "create", "desk", "--kind", "vm", "--net",
        ]);
        let Ok(Cli {
            cmd:
                Cmd::Template {
                    op:
                        TemplateCmd::Create {
                            name,
                            image,
                            memory,
                            kind,
                            net,
                            ..
                        },
                },
            ..
        }) = c
        else {
            panic!("not template create");
        };
        assert_eq!(
            (name.as_str(), image, memory, kind.as_deref(), net),
            ("desk", None, None, Some("vm"), true)
        );
        assert!(
            Cli::try_parse_from(["shoal", "template", "create", "d", "--kind", "lxc"]).is_err()
        );
        let c = Cli::try_parse_from(["shoal", "screen", "abc", "-o", "s.png"]);
        assert!(matches!(
            c,
            Ok(Cli {
                cmd: Cmd::Screen(ScreenArgs { .. }),
                ..
            })
        ));
        let c = Cli::try_parse_from(["shoal", "input", "abc", "key:ctrl+c"]);
        assert!(matches!(
            c,
            Ok(Cli {
                cmd: Cmd::Input(InputArgs { .. }),
                ..
            })
        ));
    }

    #[test]
    fn png_sizes() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend(720u32.to_be_bytes());
        png.extend(400u32.to_be_bytes());
        assert_eq!(png_size(&png), Some((720, 400)));
        assert_eq!(png_size(&png[..20]), None);
    }
}
