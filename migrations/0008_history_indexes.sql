-- profile_metrics as its history grows: what each day of every user's rows costs to write, read and keep.
--
-- Every user gets a row per day, added in the order the daily units write them (zone by zone, users by id). An index
-- whose key starts with user_id takes each new row on that user's own leaf page, so a day's rows touch one leaf per
-- user; once a user has more rows than a leaf holds (~200 at the fill such inserts leave), that is a distinct 8 KiB
-- page per user, read (when not cached) and written (a full-page image in the WAL after each checkpoint) every day.
--
-- The exactly-once key (user_id, metrics_date, version) is the same constraint whatever the order of its columns.
-- Led by the date, a day's rows go into that day's own part of the index, next to each other: the daily units touch
-- a few pages per thousand users instead of one per user, and retention finds a date's rows together. Writes name
-- all three columns (ON CONFLICT, the recompute and settings checks), so they find a row by a single probe as before.
-- The read keeps its index on (user_id, computed_at), now ascending and read backwards for the newest row: a day's
-- entry goes at the end of each user's range, where a page split keeps the older entries fuller than at its start
-- (the descending order left 53 bytes per row at 730 days, the ascending one 45).
--
-- Built before the old ones are dropped, so reads go on meanwhile; writes wait for the builds (about a minute per
-- 50 million rows on 2 cores).
CREATE UNIQUE INDEX profile_metrics_date_user_version_key ON profile_metrics (metrics_date, user_id, version);
CREATE INDEX profile_metrics_user_computed_at_asc_idx ON profile_metrics (user_id, computed_at);
ALTER TABLE profile_metrics DROP CONSTRAINT profile_metrics_user_id_metrics_date_version_key;
DROP INDEX profile_metrics_user_computed_at_idx;
ALTER INDEX profile_metrics_user_computed_at_asc_idx RENAME TO profile_metrics_user_computed_at_idx;

-- Retention removes about 1/N of the rows a day (N = METRICSD_RETENTION_DAYS). With the default scale factor (0.2)
-- autovacuum would wait until a fifth of the table is dead before making the space reusable, and the table would
-- grow by that much; at 0.02 it reclaims each week or so of removals (N = 400: every 8 days, 2 % of the table).
ALTER TABLE profile_metrics SET (autovacuum_vacuum_scale_factor = 0.02);
