//! Integer-coded enums: the wire carries the integer, Rust code sees the enum.

/// Defines an enum whose variants stand for integer codes.
///
/// `open` enums keep any other value in a catch-all variant (statuses, endpoint kinds: a peer
/// may be newer than us); `closed` enums reject unknown values with `None` (frame kinds and
/// message ids, where an unknown value means the bytes are not ours).
macro_rules! int_enum {
    (
        $(#[$meta:meta])*
        open $name:ident : $int:ty, other $other:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A code this version of urom does not know.
            $other($int),
        }

        impl $name {
            /// The enum for a code; codes this version does not know are kept as they are.
            #[inline]
            pub const fn from_raw(raw: $int) -> Self {
                match raw {
                    $( $value => Self::$variant, )+
                    other => Self::$other(other),
                }
            }

            /// The code as it travels on the wire.
            #[inline]
            pub const fn raw(self) -> $int {
                match self {
                    $( Self::$variant => $value, )+
                    Self::$other(other) => other,
                }
            }
        }

        impl From<$int> for $name {
            fn from(raw: $int) -> Self {
                Self::from_raw(raw)
            }
        }

        impl From<$name> for $int {
            fn from(value: $name) -> Self {
                value.raw()
            }
        }
    };
    (
        $(#[$meta:meta])*
        closed $name:ident : $int:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every variant, in code order.
            pub const ALL: &'static [Self] = &[$( Self::$variant, )+];

            /// The enum for a code, or `None` when the code is not one of ours.
            #[inline]
            pub const fn from_raw(raw: $int) -> Option<Self> {
                match raw {
                    $( $value => Some(Self::$variant), )+
                    _ => None,
                }
            }

            /// The code as it travels on the wire.
            pub const fn raw(self) -> $int {
                match self {
                    $( Self::$variant => $value, )+
                }
            }
        }

        impl From<$name> for $int {
            fn from(value: $name) -> Self {
                value.raw()
            }
        }
    };
}
