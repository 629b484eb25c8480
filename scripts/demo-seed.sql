-- scripts/demo-seed.sql: demo users for `scripts/run` (loaded once, into an empty, migrated database).
--
--   psql -X -v ON_ERROR_STOP=1 -f scripts/demo-seed.sql "$DATABASE_URL"
--
-- Deterministic: no random(); the same rows every time. Dates of birth are anchored to the
-- seeding date (CURRENT_DATE) so that ages stay inside their bands; edge ages keep a margin of
-- a few days so that every timezone's local date (UTC-12 .. UTC+14) gives the same age.
--
-- Users 1-300: complete, valid settings, onboarding completed.
--   Timezones: the 61 zones below, in turn (user n gets zone ((n - 1) % 61) + 1), so every zone
--   has 4-5 users; among them Asia/Kathmandu (+05:45), Pacific/Chatham (+12:45/+13:45),
--   Pacific/Kiritimati (+14), Etc/GMT+12 (-12), America/Havana and Atlantic/Azores (DST changes at
--   midnight: 00:05 is skipped or repeated), America/St_Johns (-03:30), Australia/Lord_Howe
--   (30-minute DST) and UTC.
--   Genders male/female/other and the five activity levels in turn; ages 18-87 except the edges:
--     user 1   the demo user: male, 35, 80 kg, 180 cm, moderately_active, Asia/Kathmandu
--     user 2   weight 30 kg (lower bound)          user 3   weight 300 kg (upper bound)
--     user 4   height 100 cm (lower bound)         user 5   height 250 cm (upper bound)
--     user 6   age 13 (lower bound)                user 7   age 120 (upper bound)
--     user 8   birthday today (UTC date): 30 today, 29 where the local date is still yesterday
--     user 9   born on 29 February 2000
--
-- Users 301-316: DELIBERATELY BAD rows; metricsd must skip each one with a reason (and answer
-- 404 with that reason on /v1/profile/metrics/today):
--     301  height 72 (inches typed as centimetres)   309  onboarding_completed = false
--     302  weight 350 kg                               310  height missing (NULL)
--     303  gender 'robot'                              311  weight missing (NULL)
--     304  activity level 'couch'                      312  gender missing (NULL)
--     305  date of birth missing (NULL)                313  activity level missing (NULL)
--     306  age 12                                      314  weight 29.5 kg (just under 30)
--     307  timezone 'Mars/Olympus_Mons'                315  age 121
--     308  no user_settings row at all                 316  height 251 cm (just over 250)
-- Everything else in those rows is valid, so each has exactly one problem.

\set ON_ERROR_STOP on
BEGIN;

CREATE TEMPORARY TABLE demo_timezones (n integer PRIMARY KEY, name text NOT NULL) ON COMMIT DROP;
INSERT INTO demo_timezones (n, name)
SELECT ordinality, name
FROM unnest(ARRAY[
    'Asia/Kathmandu', 'UTC', 'Pacific/Chatham', 'Pacific/Kiritimati', 'Etc/GMT+12',
    'America/Havana', 'Atlantic/Azores', 'America/St_Johns', 'Australia/Lord_Howe', 'Europe/London',
    'Europe/Berlin', 'Europe/Dublin', 'Europe/Moscow', 'Europe/Istanbul', 'Europe/Lisbon',
    'Africa/Cairo', 'Africa/Casablanca', 'Africa/Lagos', 'Africa/Johannesburg', 'Africa/Nairobi',
    'Asia/Tehran', 'Asia/Kabul', 'Asia/Kolkata', 'Asia/Colombo', 'Asia/Dhaka',
    'Asia/Yangon', 'Asia/Bangkok', 'Asia/Shanghai', 'Asia/Tokyo', 'Asia/Pyongyang',
    'Asia/Singapore', 'Asia/Dubai', 'Asia/Beirut', 'Asia/Gaza', 'Asia/Jerusalem',
    'Australia/Eucla', 'Australia/Adelaide', 'Australia/Sydney', 'Australia/Perth', 'Pacific/Auckland',
    'Pacific/Apia', 'Pacific/Tongatapu', 'Pacific/Marquesas', 'Pacific/Honolulu', 'Pacific/Pago_Pago',
    'America/Anchorage', 'America/Los_Angeles', 'America/Denver', 'America/Phoenix', 'America/Chicago',
    'America/New_York', 'America/Mexico_City', 'America/Bogota', 'America/Caracas', 'America/Santiago',
    'America/Asuncion', 'America/Sao_Paulo', 'America/Argentina/Buenos_Aires', 'America/Nuuk', 'Antarctica/Troll',
    'Etc/GMT-14'
]) WITH ORDINALITY AS t(name, ordinality);

-- Users 1-300 (valid).
INSERT INTO users (id, timezone)
SELECT g, z.name
FROM generate_series(1, 300) AS g
JOIN demo_timezones AS z ON z.n = (g - 1) % (SELECT count(*) FROM demo_timezones) + 1;

INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level, onboarding_completed)
SELECT g,
       CASE g
           WHEN 1 THEN (CURRENT_DATE - interval '35 years' - interval '100 days')::date
           WHEN 6 THEN (CURRENT_DATE - interval '13 years' - interval '2 days')::date
           WHEN 7 THEN (CURRENT_DATE - interval '120 years' - interval '30 days')::date
           WHEN 8 THEN (CURRENT_DATE - interval '30 years')::date
           WHEN 9 THEN DATE '2000-02-29'
           ELSE (CURRENT_DATE - make_interval(years => 18 + (g * 7) % 70, days => (g * 37) % 360))::date
       END,
       CASE WHEN g = 1 THEN 'male' ELSE (ARRAY['female', 'male', 'other'])[1 + g % 3] END,
       CASE
           WHEN g = 1 THEN 80
           WHEN g = 2 THEN 30
           WHEN g = 3 THEN 300
           WHEN g % 50 = 0 THEN 140 + (g % 37) * 3.5           -- a few heavy users
           ELSE 45 + ((g * 29) % 800) / 10.0                   -- 45.0-124.9 kg
       END,
       CASE
           WHEN g = 1 THEN 180
           WHEN g = 4 THEN 100
           WHEN g = 5 THEN 250
           WHEN g % 40 = 0 THEN 120 + g % 30                   -- a few short users
           ELSE 150 + ((g * 13) % 450) / 10.0                  -- 150.0-194.9 cm
       END,
       CASE WHEN g = 1 THEN 'moderately_active'
            ELSE (ARRAY['sedentary', 'lightly_active', 'moderately_active', 'very_active', 'extremely_active'])[1 + (g / 3) % 5]
       END,
       true
FROM generate_series(1, 300) AS g;

-- Users 301-316 (deliberately bad; see the table at the top).
INSERT INTO users (id, timezone) VALUES
    (301, 'America/New_York'), (302, 'Europe/Berlin'), (303, 'Asia/Tokyo'), (304, 'Australia/Sydney'),
    (305, 'UTC'), (306, 'America/Sao_Paulo'), (307, 'Mars/Olympus_Mons'), (308, 'Africa/Lagos'),
    (309, 'Asia/Kolkata'), (310, 'Europe/London'), (311, 'America/Chicago'), (312, 'Pacific/Auckland'),
    (313, 'Asia/Kathmandu'), (314, 'America/Los_Angeles'), (315, 'Europe/Moscow'), (316, 'Asia/Singapore');

INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level, onboarding_completed)
SELECT user_id,
       CASE WHEN dob_missing THEN NULL ELSE (CURRENT_DATE - make_interval(years => age_years, days => 2))::date END,
       gender, current_weight, height, activity_level, onboarding_completed
FROM (VALUES
    -- user_id, age, dob missing, gender, weight, height, activity, onboarding completed
    (301, 40, false, 'male',   82.00, 72.0,  'lightly_active',    true),   -- height 72
    (302, 45, false, 'female', 350.00, 165.0, 'sedentary',        true),   -- weight 350
    (303, 30, false, 'robot',  70.00, 175.0, 'very_active',       true),   -- gender 'robot'
    (304, 52, false, 'male',   95.00, 178.0, 'couch',             true),   -- activity 'couch'
    (305, 33, true,  'female', 61.00, 168.0, 'moderately_active', true),   -- no date of birth
    (306, 12, false, 'male',   42.00, 152.0, 'very_active',       true),   -- age 12
    (307, 28, false, 'other',  68.00, 172.0, 'extremely_active',  true),   -- timezone Mars/Olympus_Mons
                                                                           -- 308: no settings row
    (309, 37, false, 'female', 64.00, 166.0, 'lightly_active',    false),  -- onboarding not completed
    (310, 41, false, 'male',   77.00, NULL,  'sedentary',         true),   -- height missing
    (311, 29, false, 'female', NULL,  160.0, 'moderately_active', true),   -- weight missing
    (312, 50, false, NULL,     88.00, 181.0, 'very_active',       true),   -- gender missing
    (313, 26, false, 'other',  58.00, 163.0, NULL,                true),   -- activity missing
    (314, 19, false, 'female', 29.50, 150.0, 'sedentary',         true),   -- weight 29.5
    (315, 121, false, 'male',  60.00, 165.0, 'sedentary',         true),   -- age 121
    (316, 34, false, 'male',   110.00, 251.0, 'extremely_active', true)    -- height 251
) AS bad(user_id, age_years, dob_missing, gender, current_weight, height, activity_level, onboarding_completed);

SELECT setval(pg_get_serial_sequence('users', 'id'), max(id)) FROM users;

-- Onboarded a day ago, like an install's existing users: the daily units compute them, and the settings sweep
-- (which looks only at recent changes) leaves them alone, also when the demo starts again with new formulas.
UPDATE user_settings SET updated_at = now() - interval '1 day';

COMMIT;
