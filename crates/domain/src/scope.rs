//! What an API key may do: its scopes.

use std::fmt;

/// One permission of an API key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Get and list runs, read their events.
    RunsRead,
    /// Create and cancel runs (and read them).
    RunsWrite,
    /// Decide approvals, read the inbox (and read runs).
    ApprovalsDecide,
    WebhooksManage,
    /// Replace the owner's approval policy and try rules on its history
    /// (and read runs).
    PoliciesManage,
}

impl Scope {
    pub const ALL: [Scope; 5] =
        [Scope::RunsRead, Scope::RunsWrite, Scope::ApprovalsDecide, Scope::WebhooksManage, Scope::PoliciesManage];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::RunsRead => "runs:read",
            Scope::RunsWrite => "runs:write",
            Scope::ApprovalsDecide => "approvals:decide",
            Scope::WebhooksManage => "webhooks:manage",
            Scope::PoliciesManage => "policies:manage",
        }
    }

    pub fn parse(text: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == text)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A key's scopes, with what each implies: `runs:write`,
/// `approvals:decide` and `policies:manage` include `runs:read`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope: a key created without `--scope`, and every key from
    /// before keys had scopes.
    pub fn all() -> Scopes {
        Scopes::of(Scope::ALL)
    }

    pub fn of(scopes: impl IntoIterator<Item = Scope>) -> Scopes {
        Scopes(scopes.into_iter().fold(0, |bits, scope| bits | scope.bit()))
    }

    pub fn allows(self, needed: Scope) -> bool {
        let implied = match needed {
            Scope::RunsRead => Scope::RunsWrite.bit() | Scope::ApprovalsDecide.bit() | Scope::PoliciesManage.bit(),
            _ => 0,
        };
        self.0 & (needed.bit() | implied) != 0
    }

    /// The scopes as named, in a fixed order.
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL.into_iter().filter(|scope| self.0 & scope.bit() != 0).map(Scope::as_str).collect()
    }

    /// Whether these are all the scopes this build knows.
    pub fn is_all(self) -> bool {
        self == Scopes::all()
    }

    /// The scopes of a stored key: `None` (a key from before scopes, or one
    /// made without `--scope`) is every scope, also ones added later; a name
    /// this build does not know grants nothing.
    pub fn stored<'a>(names: Option<impl IntoIterator<Item = &'a str>>) -> Scopes {
        match names {
            None => Scopes::all(),
            Some(names) => Scopes::of(names.into_iter().filter_map(Scope::parse)),
        }
    }

    /// What a store keeps: `None` for every scope.
    pub fn to_stored(self) -> Option<Vec<&'static str>> {
        (!self.is_all()).then(|| self.names())
    }

    /// Parses names given on the command line; `Err` names the first
    /// unknown one.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Scopes, String> {
        names
            .into_iter()
            .map(|name| Scope::parse(name).ok_or_else(|| name.to_owned()))
            .collect::<Result<Vec<_>, _>>()
            .map(Scopes::of)
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_and_decide_imply_read_and_nothing_else() {
        let write = Scopes::of([Scope::RunsWrite]);
        assert!(write.allows(Scope::RunsRead) && write.allows(Scope::RunsWrite));
        assert!(!write.allows(Scope::ApprovalsDecide) && !write.allows(Scope::WebhooksManage));
        let decide = Scopes::of([Scope::ApprovalsDecide]);
        assert!(decide.allows(Scope::RunsRead) && !decide.allows(Scope::RunsWrite));
        let read = Scopes::of([Scope::RunsRead]);
        assert!(read.allows(Scope::RunsRead) && !read.allows(Scope::RunsWrite));
        assert!(Scope::ALL.into_iter().all(|scope| Scopes::all().allows(scope)));
        assert_eq!(
            Scopes::parse(["runs:read", "approvals:decide"]).unwrap().names(),
            ["runs:read", "approvals:decide"]
        );
        assert_eq!(Scopes::parse(["runs:read", "runs:delete"]), Err("runs:delete".to_owned()));
    }
}
