-- See postgres/0007_notes_search.sql: SQLite's unicode61 tokenizer already
-- splits words at punctuation and folds accents, so nothing changes here;
-- the version keeps both lists in step.
SELECT 1;
