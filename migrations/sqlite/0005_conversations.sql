-- See postgres/0005_conversations.sql. Instants are INTEGER microseconds.
CREATE TABLE convo_threads (
    project_id TEXT    NOT NULL,
    thread_id  TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    next_seq   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, thread_id)
) STRICT;
CREATE INDEX convo_threads_updated ON convo_threads (project_id, updated_at);

CREATE TABLE convo_turns (
    project_id TEXT    NOT NULL,
    thread_id  TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    message    TEXT    NOT NULL,
    PRIMARY KEY (project_id, thread_id, seq)
) STRICT;

CREATE TABLE convo_notes (
    project_id TEXT    NOT NULL,
    agent      TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    body       TEXT    NOT NULL,
    tags       TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (project_id, agent, key)
) STRICT;
CREATE INDEX convo_notes_updated ON convo_notes (project_id, updated_at);

-- The full-text index over key and body, kept in step with the table by
-- the three triggers below (external content: the text is stored once).
-- unicode61 folds case and does no stemming, like PostgreSQL's 'simple'.
CREATE VIRTUAL TABLE convo_notes_fts USING fts5(
    key, body, content='convo_notes', content_rowid='rowid', tokenize='unicode61'
);

CREATE TRIGGER convo_notes_ai AFTER INSERT ON convo_notes BEGIN
    INSERT INTO convo_notes_fts (rowid, key, body) VALUES (NEW.rowid, NEW.key, NEW.body);
END;

CREATE TRIGGER convo_notes_ad AFTER DELETE ON convo_notes BEGIN
    INSERT INTO convo_notes_fts (convo_notes_fts, rowid, key, body)
    VALUES ('delete', OLD.rowid, OLD.key, OLD.body);
END;

CREATE TRIGGER convo_notes_au AFTER UPDATE ON convo_notes BEGIN
    INSERT INTO convo_notes_fts (convo_notes_fts, rowid, key, body)
    VALUES ('delete', OLD.rowid, OLD.key, OLD.body);
    INSERT INTO convo_notes_fts (rowid, key, body) VALUES (NEW.rowid, NEW.key, NEW.body);
END;
