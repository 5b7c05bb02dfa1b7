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

/// Defines a message family, the enum of every body that travels on one channel, and its
/// [`crate::frame::Body`] implementation, from one table.
///
/// Each row is a variant, named as its [`crate::FrameKind`], and its body:
///
/// * `Variant(Type)`: `Type` implements [`crate::codec::Message`];
/// * `Variant`: an empty body ([`crate::codec::Empty`]);
/// * `Variant { field: Type, .. } as Codec`: the fields of `Codec`, a struct with the same
///   fields that implements [`crate::codec::Message`].
///
/// From the table come the enum, `kind`, `parse` (a kind of another family is
/// [`crate::DecodeError::UnexpectedKind`]), `body_len`, `emit`, and `LARGEST_FIXED`, the
/// largest fixed part of the family's bodies, asserted at compile time to fit
/// `limits::LARGEST_FIXED_BODY`. Adding a message is adding its frame kind, its type with its
/// `Message` implementation, and one row here.
macro_rules! message_family {
    (
        $(#[$meta:meta])*
        pub enum $name:ident<$a:lifetime> {
            $(
                $(#[$vmeta:meta])*
                $variant:ident
                $( ( $ty:ty ) )?
                $( { $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),+ $(,)? } as $codec:ident )?
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name<$a> {
            $(
                $(#[$vmeta])*
                $variant $( ($ty) )? $( { $( $(#[$fmeta])* $field: $fty ),+ } )?,
            )+
        }

        impl<$a> $name<$a> {
            /// The largest fixed part of this family's bodies.
            #[allow(dead_code)]
            pub(crate) const LARGEST_FIXED: usize = $crate::codec::largest(&[
                $( message_family!(@fixed $a $( ($ty) )? $( as $codec )?), )+
            ]);
        }

        static_assertions::const_assert!(
            $name::<'static>::LARGEST_FIXED <= $crate::limits::LARGEST_FIXED_BODY
        );

        impl<$a> $crate::frame::Body<$a> for $name<$a> {
            #[inline]
            fn kind(&self) -> $crate::FrameKind {
                match self {
                    $( Self::$variant { .. } => $crate::FrameKind::$variant, )+
                }
            }

            #[inline]
            fn parse(
                kind: $crate::FrameKind,
                body: &$a [u8],
            ) -> Result<Self, $crate::DecodeError> {
                match kind {
                    $(
                        $crate::FrameKind::$variant => Ok(message_family!(
                            @parse body, $variant $( ($ty) )? $( { $($field),+ } as $codec )?
                        )),
                    )+
                    #[allow(unreachable_patterns)]
                    other => Err($crate::DecodeError::UnexpectedKind(other.raw())),
                }
            }

            #[inline]
            fn body_len(&self) -> usize {
                match self {
                    $(
                        message_family!(@pat inner, $variant $( ($ty) )? $( { $($field),+ } )?)
                        => message_family!(
                            @body_len inner, $variant $( ($ty) )? $( { $($field),+ } as $codec )?
                        ),
                    )+
                }
            }

            #[inline]
            fn emit(&self, dst: &mut [u8]) -> Result<(), $crate::EncodeError> {
                match self {
                    $(
                        message_family!(@pat inner, $variant $( ($ty) )? $( { $($field),+ } )?)
                        => message_family!(
                            @emit inner, dst, $variant $( ($ty) )? $( { $($field),+ } as $codec )?
                        ),
                    )+
                }
            }
        }
    };

    (@fixed $a:lifetime ($ty:ty)) => {
        <$ty as $crate::codec::Message<$a>>::FIXED_LEN
    };
    (@fixed $a:lifetime) => {
        <$crate::codec::Empty as $crate::codec::Message<$a>>::FIXED_LEN
    };
    (@fixed $a:lifetime as $codec:ident) => {
        <$codec as $crate::codec::Message<$a>>::FIXED_LEN
    };

    (@parse $body:ident, $variant:ident ($ty:ty)) => {
        Self::$variant(<$ty as $crate::codec::Message>::parse($body)?)
    };
    (@parse $body:ident, $variant:ident) => {{
        <$crate::codec::Empty as $crate::codec::Message>::parse($body)?;
        Self::$variant
    }};
    (@parse $body:ident, $variant:ident { $($field:ident),+ } as $codec:ident) => {{
        let $codec { $($field),+ } = <$codec as $crate::codec::Message>::parse($body)?;
        Self::$variant { $($field),+ }
    }};

    (@pat $inner:ident, $variant:ident ($ty:ty)) => {
        Self::$variant($inner)
    };
    (@pat $inner:ident, $variant:ident) => {
        Self::$variant
    };
    (@pat $inner:ident, $variant:ident { $($field:ident),+ }) => {
        Self::$variant { $($field),+ }
    };

    (@body_len $inner:ident, $variant:ident ($ty:ty)) => {
        $crate::codec::Message::body_len($inner)
    };
    (@body_len $inner:ident, $variant:ident) => {
        $crate::codec::Message::body_len(&$crate::codec::Empty)
    };
    (@body_len $inner:ident, $variant:ident { $($field:ident),+ } as $codec:ident) => {
        $crate::codec::Message::body_len(&$codec { $($field: *$field),+ })
    };

    (@emit $inner:ident, $dst:ident, $variant:ident ($ty:ty)) => {
        $crate::codec::Message::emit($inner, $dst)
    };
    (@emit $inner:ident, $dst:ident, $variant:ident) => {
        $crate::codec::Message::emit(&$crate::codec::Empty, $dst)
    };
    (@emit $inner:ident, $dst:ident, $variant:ident { $($field:ident),+ } as $codec:ident) => {
        $crate::codec::Message::emit(&$codec { $($field: *$field),+ }, $dst)
    };
}
