//! What the layout around every page needs: who is looking (for the
//! navigation) and the CSRF token its forms carry.

use crate::{Viewer, Visitor};

/// The layout's fields; every page template has one as `chrome`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chrome {
    /// Accounts exist on this server (auth is on).
    pub accounts: bool,
    pub signup_open: bool,
    /// Someone is signed in.
    pub signed_in: bool,
    /// The signed-in person is an admin (client listener).
    pub admin: bool,
    /// The admin listener's read-only view: no sign-in, no forms.
    pub local: bool,
    /// The token every form posts back; empty when not signed in.
    pub csrf: String,
    /// Whether anyone is signed in cannot be told (the account store is
    /// unreachable): no sign-in and no sign-out are offered.
    pub unsure: bool,
}

impl Chrome {
    /// For a page on the client listener.
    pub(crate) fn for_visitor(web: &crate::Web, visitor: &Visitor) -> Chrome {
        let s = &web.settings;
        match visitor {
            Visitor::Person(p) => Chrome {
                accounts: s.accounts,
                signup_open: s.signup_open,
                signed_in: true,
                admin: p.admin,
                local: false,
                csrf: p.csrf.clone(),
                unsure: false,
            },
            Visitor::Anonymous => Chrome {
                accounts: s.accounts,
                signup_open: s.signup_open,
                ..Chrome::default()
            },
        }
    }

    /// For a page shown while the account store cannot say who is
    /// looking: offering to sign in would tell a signed-in person that
    /// they were signed out.
    pub(crate) fn unsure(web: &crate::Web) -> Chrome {
        Chrome {
            accounts: web.settings.accounts,
            unsure: true,
            ..Chrome::default()
        }
    }

    /// For an `/admin/…` page, on either listener.
    pub(crate) fn for_viewer(web: &crate::Web, viewer: &Viewer) -> Chrome {
        match viewer {
            Viewer::Admin(p) => Chrome::for_visitor(web, &Visitor::Person(p.clone())),
            Viewer::Local => Chrome {
                accounts: web.settings.accounts,
                local: true,
                ..Chrome::default()
            },
        }
    }
}

/// Any refusal, as a page.
#[derive(Debug, askama::Template)]
#[template(path = "error.html")]
pub(crate) struct ErrorPage {
    pub chrome: Chrome,
    pub status: u16,
    pub text: String,
    /// The request's id (`x-request-id`), for a person to quote.
    pub request_id: Option<String>,
}
