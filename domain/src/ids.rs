//! Typed ids: a node's, a replica's and a shard's, where strings of
//! different kinds would otherwise meet (one map keyed by "a replica or a
//! node id", a function taking three strings).
//!
//! Each is the string it always was on the wire and in the log
//! (`#[serde(transparent)]`), borrows as `str` (a map keyed by ids is
//! looked up with a `&str`), and derefs to `str` for reading. Making one
//! from a string is explicit (`From`), so that a node's name cannot become
//! a replica's by accident.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(s)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(s.to_owned())
            }
        }

        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                $name(s.clone())
            }
        }

        impl Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        // As the string: messages quote an id as they quoted its string.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

id!(
    /// A node: the name its agent registers under (and its certificate's
    /// common name).
    NodeId
);
id!(
    /// A replica: one running copy of a model, over one or more shards.
    ReplicaId
);
id!(
    /// A shard: one rank of a replica, one process on one node.
    ShardId
);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn an_id_is_its_string_in_json_and_is_looked_up_by_str() {
        let id = ReplicaId::from("r-1");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"r-1\"");
        assert_eq!(serde_json::from_str::<ReplicaId>("\"r-1\"").unwrap(), id);
        let map: BTreeMap<ReplicaId, u32> = [(id.clone(), 7)].into();
        assert_eq!(map.get("r-1"), Some(&7));
        assert_eq!(id, "r-1");
        assert_eq!(id.to_string(), "r-1");
        assert_eq!(format!("{id:?}"), "\"r-1\"", "quoted as its string was");
    }
}
