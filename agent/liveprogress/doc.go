// Package liveprogress writes the live pull progress of running build
// jobs to CubeMaster's Redis, where CubeMaster overlays it on job polls
// while a job is RUNNING.
//
// Each job has one HASH, Key(jobID) = "template_image_job_pull_progress:"
// + job ID, with the fields job_id, pull_total_bytes,
// pull_downloaded_bytes, pull_total_layers, pull_completed_layers,
// pull_speed_bps and updated_at_ms (decimal integers; updated_at_ms is
// when the hash was written, in Unix milliseconds).
//
// Why it is built the way it is:
//
//   - It never slows or fails a build. Update and Finish only record the
//     latest value in memory and return; one background goroutine does
//     all Redis I/O, each round trip bounded by Options.Timeout. When
//     Redis is down or refuses the password, values keep coalescing
//     (the latest wins), writes are retried with a backoff of up to 5 s,
//     failures are counted and logged at most once a minute.
//   - The TTL (KeyTTL, one hour) is set on every write, in the same Lua
//     script as the HSET, so a key always has one and a pull longer than
//     an hour keeps its key alive, while a key whose deletion was lost
//     still expires. Setting it only on the first write would let the key
//     expire mid-pull and come back without any TTL.
//   - A job's hash is written at most once per Options.MinInterval
//     (800 ms, as upstream's native puller): the first value of a job
//     goes out at once, later ones wait out the interval and only the
//     latest is sent.
//   - Finish sends the job's last value without waiting for the interval,
//     then deletes the key (upstream's final flush), so CubeMaster falls
//     back to the numbers in its database. An Update after Finish starts
//     the job's progress anew.
//   - Memory is bounded: one small entry per job with progress not yet
//     written or a deletion not yet done, at most Options.MaxJobs; idle
//     entries are dropped one interval after their last write, and a
//     deletion that cannot be made is abandoned after KeyTTL, when the
//     key has expired anyway.
//
// A nil *Writer is valid and writes nothing, for an agent without a
// Redis. The package takes plain Options and imports no other package of
// the project.
package liveprogress
