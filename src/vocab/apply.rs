//! The argument layout of `RLOCK.APPLY`, the internal command that carries one module
//! command's effects to replicas and the AOF (SPEC 1.4, `rlock.replication commands`).
//! Pure: the glue that writes it is `server::ffi::replication`, the command that reads it
//! is `server::replication`.
//!
//! `RLOCK.APPLY` is a list of plain commands, one after another. The common ones have a
//! fixed number of arguments and are written bare (`HSET k owner 1 PEXPIREAT k 1700…`);
//! any other command, or one of them with another count (an HSET of several fields, SET
//! with PXAT), is written after its word count (`5 SET k v PXAT 1700…`: the count covers
//! the name and its arguments). A count is a number and no command name is, so the reader
//! never confuses the two. Bare writing keeps the
//! replicated command short: each argument costs the primary an allocation and the AOF
//! a few bytes on every lock command.

/// The internal command's name, as the server knows it.
pub const APPLY: &[u8] = b"RLOCK.APPLY";

/// The commands written without a count, with their number of arguments (after the name).
const FIXED: &[(&[u8], usize)] = &[
    (b"HSET", 3),
    (b"HINCRBY", 3),
    (b"HDEL", 2),
    (b"PEXPIREAT", 2),
    (b"DEL", 1),
    (b"PERSIST", 1),
    (b"SET", 2),
    (b"INCRBY", 2),
    (b"DECRBY", 2),
    (b"PUBLISH", 2),
];

/// True when a command named `name` with `args` arguments is written bare.
pub fn bare(name: &[u8], args: usize) -> bool {
    FIXED.iter().any(|(n, a)| *n == name && *a == args)
}

/// Splits `RLOCK.APPLY`'s arguments (after its name) into the plain commands they carry,
/// each as a range of `argv` (the name first). An error names what is wrong; nothing is
/// applied then.
pub fn split(argv: &[&[u8]]) -> Result<Vec<std::ops::Range<usize>>, &'static str> {
    let mut commands = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let word = argv[i];
        let (start, len) = if let Some(&(_, args)) = FIXED.iter().find(|(n, _)| *n == word) {
            (i, 1 + args)
        } else {
            let count = std::str::from_utf8(word)
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .filter(|&n| n >= 1)
                .ok_or("ERR RLOCK.APPLY: expected a command or a word count")?;
            (i + 1, count)
        };
        let end = start
            .checked_add(len)
            .filter(|&end| end <= argv.len())
            .ok_or("ERR RLOCK.APPLY: a command is cut short")?;
        commands.push(start..end);
        i = end;
    }
    if commands.is_empty() {
        return Err("ERR RLOCK.APPLY: nothing to apply");
    }
    Ok(commands)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn bare_and_counted_commands_split_where_they_were_joined() {
        let argv = words("HSET k o 1 PEXPIREAT k 99 5 SET r v PXAT 99 DEL k 3 HSET k a");
        let got: Vec<Vec<&[u8]>> = split(&argv)
            .unwrap()
            .into_iter()
            .map(|r| argv[r].to_vec())
            .collect();
        assert_eq!(
            got,
            vec![
                words("HSET k o 1"),
                words("PEXPIREAT k 99"),
                words("SET r v PXAT 99"),
                words("DEL k"),
                words("HSET k a"),
            ]
        );
    }

    #[test]
    fn an_argument_that_looks_like_a_command_is_still_an_argument() {
        // The owner id is "DEL": it sits inside HSET's fixed arguments, never read as a name.
        let argv = words("HSET k DEL 1 PUBLISH c HSET");
        assert_eq!(split(&argv).unwrap(), vec![0..4, 4..7]);
    }

    #[test]
    fn every_written_command_reads_back() {
        // What the writer decides (bare or counted) the reader undoes, for each shape.
        for (name, args) in [("HSET", 3), ("HSET", 5), ("SET", 4), ("ZADD", 3), ("DEL", 1)] {
            let mut argv: Vec<Vec<u8>> = Vec::new();
            if !bare(name.as_bytes(), args) {
                argv.push((args + 1).to_string().into_bytes());
            }
            argv.push(name.as_bytes().to_vec());
            argv.extend((0..args).map(|i| format!("a{i}").into_bytes()));
            let refs: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
            let ranges = split(&refs).unwrap();
            assert_eq!(ranges.len(), 1, "{name}/{args}");
            assert_eq!(ranges[0].len(), args + 1, "{name}/{args}");
        }
    }

    #[test]
    fn malformed_input_is_refused_whole() {
        for bad in ["", "HSET k o", "7 SET k v", "0 DEL k", "-1 DEL", "NOPE k", "DEL k 2 SET"] {
            let argv = if bad.is_empty() { vec![] } else { words(bad) };
            assert!(split(&argv).is_err(), "{bad:?}");
        }
    }
}
