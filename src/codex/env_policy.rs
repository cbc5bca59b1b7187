//! The child's environment, built as Codex's own exec-server builds it:
//! without a policy exactly the `env` the client sent; with one, the
//! executor's environment filtered by the policy, then `env` on top. The
//! executor's environment is the capexec server's (where the child runs),
//! which the bridge reads once per session, not the bridge's own.

use std::collections::BTreeMap;

use super::protocol::EnvPolicy;

/// What `inherit: "core"` keeps (Codex 0.169.0 keeps LANG too, as
/// observed side by side).
const CORE_VARIABLES: &[&str] = &[
    "HOME", "LANG", "LOGNAME", "PATH", "SHELL", "USER", "USERNAME", "TMPDIR", "TEMP", "TMP",
];

/// Names that look like secrets, dropped unless `ignoreDefaultExcludes`.
const DEFAULT_EXCLUDES: &[&str] = &["*KEY*", "*SECRET*", "*TOKEN*"];

/// Never passed on, whatever the policy: it is the exec-server's own
/// switch, not the child's.
const NOT_INHERITED: &[&str] = &["CODEX_EXEC_SERVER_EXIT_ON_STDIN_CLOSE"];

/// The environment of a child.
pub fn child_environment(
    executor_environment: &BTreeMap<String, String>,
    policy: Option<&EnvPolicy>,
    env: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut child = match policy {
        None => BTreeMap::new(),
        Some(policy) => filtered(executor_environment, policy)?,
    };
    child.extend(
        env.iter()
            .map(|(name, value)| (name.clone(), value.clone())),
    );
    for name in NOT_INHERITED {
        child.remove(*name);
    }
    Ok(child)
}

fn filtered(
    executor_environment: &BTreeMap<String, String>,
    policy: &EnvPolicy,
) -> Result<BTreeMap<String, String>, String> {
    let mut child: BTreeMap<String, String> = match policy.inherit.as_str() {
        "all" => executor_environment.clone(),
        "none" => BTreeMap::new(),
        "core" => executor_environment
            .iter()
            .filter(|(name, _)| CORE_VARIABLES.contains(&name.as_str()))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
        other => {
            return Err(format!(
                "unknown variant `{other}`, expected one of `all`, `none`, `core`"
            ));
        }
    };
    if !policy.ignore_default_excludes {
        child.retain(|name, _| {
            !DEFAULT_EXCLUDES
                .iter()
                .any(|pattern| matches(pattern, name))
        });
    }
    child.retain(|name, _| !policy.exclude.iter().any(|pattern| matches(pattern, name)));
    child.extend(
        policy
            .set
            .iter()
            .map(|(name, value)| (name.clone(), value.clone())),
    );
    if !policy.include_only.is_empty() {
        child.retain(|name, _| {
            policy
                .include_only
                .iter()
                .any(|pattern| matches(pattern, name))
        });
    }
    Ok(child)
}

/// Whether `name` matches `pattern` (`*` any run, `?` one character),
/// ignoring ASCII case, as Codex matches them.
fn matches(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().map(|c| c.to_ascii_uppercase()).collect();
    let name: Vec<char> = name.chars().map(|c| c.to_ascii_uppercase()).collect();
    // Iterative wildcard matching with one backtrack point: linear in
    // practice, never exponential.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some((p, n));
            p += 1;
        } else if let Some((star_p, star_n)) = star {
            p = star_p + 1;
            n = star_n + 1;
            star = Some((star_p, star_n + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn policy(inherit: &str) -> EnvPolicy {
        EnvPolicy {
            inherit: inherit.to_string(),
            ..EnvPolicy::default()
        }
    }

    #[test]
    fn wildcards_ignore_case() {
        assert!(matches("*KEY*", "openai_api_key"));
        assert!(matches("CODEX_*", "CODEX_HOME"));
        assert!(matches("A?C", "abc"));
        assert!(!matches("A?C", "abbc"));
        assert!(matches("*", ""));
        assert!(!matches("PATH", "PATHS"));
    }

    #[test]
    fn without_a_policy_the_child_gets_exactly_env() {
        let server = map(&[("PATH", "/bin"), ("HOME", "/root")]);
        let env = map(&[
            ("TERM", "dumb"),
            ("CODEX_EXEC_SERVER_EXIT_ON_STDIN_CLOSE", "1"),
        ]);
        assert_eq!(
            child_environment(&server, None, &env).unwrap(),
            map(&[("TERM", "dumb")])
        );
    }

    #[test]
    fn a_policy_filters_the_executors_environment_then_env_wins() {
        let server = map(&[
            ("PATH", "/bin"),
            ("HOME", "/root"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("GITHUB_TOKEN", "t"),
            ("CODEX_HOME", "/c"),
            ("LANG", "C"),
        ]);
        let env = map(&[("TERM", "dumb"), ("PATH", "/usr/bin")]);
        let mut all = policy("all");
        all.exclude = vec!["codex_*".into()];
        assert_eq!(
            child_environment(&server, Some(&all), &env).unwrap(),
            map(&[
                ("HOME", "/root"),
                ("LANG", "C"),
                ("PATH", "/usr/bin"),
                ("TERM", "dumb")
            ])
        );
        all.ignore_default_excludes = true;
        all.set = map(&[("X", "1")]);
        all.include_only = vec!["*TOKEN".into(), "X".into(), "PATH".into()];
        assert_eq!(
            child_environment(&server, Some(&all), &BTreeMap::new()).unwrap(),
            map(&[("GITHUB_TOKEN", "t"), ("PATH", "/bin"), ("X", "1")])
        );
        assert_eq!(
            child_environment(&server, Some(&policy("core")), &BTreeMap::new()).unwrap(),
            map(&[("HOME", "/root"), ("LANG", "C"), ("PATH", "/bin")])
        );
        assert_eq!(
            child_environment(&server, Some(&policy("none")), &env).unwrap(),
            env
        );
        assert!(child_environment(&server, Some(&policy("some")), &env).is_err());
    }
}
