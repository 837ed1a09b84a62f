"""The mutation table of docs/guarantees.md, run by one command: `make mutants` (or `python tests/mutants.py`).

Each mutant breaks one guarantee (or one weak test's point) by replacing an exact piece of text in one file;
the named tests must then fail ("killed"). The shared working tree is never touched: the repository's files
(tracked and untracked, not ignored) are copied into a temporary folder, every mutant is applied there one at a
time, and its tests run from that folder with this venv (`python -m pytest -x`; the copy comes first on
sys.path and PYTHONPATH, before the editable install). The unmutated copy must pass the same tests first, else
the row is invalid. Not collected by pytest (no `test_` prefix); tests/test_mutants_table.py checks that this
list and the doc's table agree.

    python tests/mutants.py                 # every mutant; prints the table
    python tests/mutants.py L4 A1           # only these
    python tests/mutants.py --write-doc     # also rewrite the table in docs/guarantees.md
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "guarantees.md"
BEGIN, END = "<!-- mutants:begin -->", "<!-- mutants:end -->"


@dataclass(frozen=True)
class Mutant:
    id: str
    guarantee: str   # the row of docs/guarantees.md (or the weak test) it breaks
    what: str        # the mutation, in words
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]


W = "tests/test_write_path.py::"
BAD = "tests/test_bad_inputs.py::test_bad_input"
SIG = "tests/test_signal_phases.py::"
RC = "tests/test_run_check.py::"
CC = "tests/test_chunkcopy.py::"

MUTANTS = [
    # ------------------------------------------------------------ atomic shards
    Mutant("A1", "Atomic shards", "local shard written straight to the final name (plain open(final, 'wb'))",
           "tasks/storage/local.py",
           "        return Written(self._replace(uri, write))",
           "        write(uri)\n        return Written(os.path.getsize(uri))",
           (W + "test_a_write_failing_half_way_never_shows_at_the_final_name",)),
    Mutant("A2", "Atomic shards", "local text write (`put`) straight to the final name", "tasks/storage/local.py",
           "        self._replace(uri, write)", "        with open(uri, \"wb\") as f:\n            write(f)",
           (W + "test_text_writes_are_atomic_too",)),
    Mutant("A3", "Atomic shards", "a failed write's temp file left behind", "tasks/storage/local.py",
           "                temp.remove()\n                temp.refuse", "                temp.refuse",
           ("tests/test_merge_kernel.py::test_failed_local_write_leaves_no_temp_file",
            W + "test_a_write_failing_half_way_never_shows_at_the_final_name")),
    Mutant("A4", "Atomic shards", "a failed multipart upload completed with the parts already in",
           "tasks/storage/s3.py",
           "            except BaseException:\n                upload.abort()\n                raise",
           "            except BaseException:\n                upload.complete()\n                raise",
           (W + "test_a_multipart_upload_failing_after_a_part_leaves_no_object_and_no_upload",)),
    # ------------------------------------------------------------ orphaned uploads
    Mutant("O1", "No orphaned uploads after failures", "a failed multipart upload not aborted", "tasks/storage/s3.py",
           "                upload.abort()\n                raise", "                raise",
           (W + "test_a_multipart_upload_failing_after_a_part_leaves_no_object_and_no_upload",)),
    Mutant("O2", "No orphaned uploads after failures", "sweep_stale keeps uploads older than the threshold",
           "tasks/storage/s3.py", "            if started < cutoff:", "            if False:",
           (W + "test_sweep_aborts_old_uploads_and_keeps_young_ones",)),
    Mutant("O3", "No orphaned uploads after failures", "sweep_stale keeps a dead writer's temp file",
           "tasks/storage/local.py", "    except ProcessLookupError:\n        return True",
           "    except ProcessLookupError:\n        return False",
           (W + "test_sweep_removes_a_dead_writers_temp_file_only",)),
    Mutant("O4", "No orphaned uploads after failures", "an upload this process did not start is aborted (every other "
           "upload of the key, when a CreateMultipartUpload is retried)", "tasks/storage/s3.py",
           "            self.upload = reply[\"UploadId\"]\n",
           "            self.upload = reply[\"UploadId\"]\n"
           "            if reply.get(\"ResponseMetadata\", {}).get(\"RetryAttempts\"):\n"
           "                for u in self.fs.call_s3(\"list_multipart_uploads\", Bucket=self.bucket, Prefix=self.key)"
           ".get(\"Uploads\", []):\n"
           "                    if u[\"UploadId\"] != self.upload:\n"
           "                        abort_upload(self.fs, self.bucket, self.key, u[\"UploadId\"])\n",
           ("tests/test_s3_uploads.py::test_a_retried_create_never_aborts_another_writers_upload",)),
    Mutant("O5", "No orphaned uploads after failures", "the dry run sweeps leftovers (temp files, old uploads)",
           "tasks/dryrun.py", "    plan = make_plan(job, overwrite=overwrite)\n",
           "    plan = make_plan(job, overwrite=overwrite)\n"
           "    __import__(\"tasks.storage\").storage.sweep_stale(output_prefix)\n",
           ("tests/test_dry_run.py::test_dry_run_sweeps_no_leftovers",)),
    Mutant("O6", "No orphaned uploads after failures", "sweep_stale aborts uploads younger than the threshold (a live "
           "run's)", "tasks/storage/s3.py", "            if started < cutoff:", "            if True:",
           (W + "test_sweep_aborts_old_uploads_and_keeps_young_ones",
            "tests/test_s3_uploads.py::test_a_runs_start_up_sweep_never_touches_a_concurrent_runs_upload")),
    # ------------------------------------------------------------ retries
    Mutant("R1", "Retries with backoff on flaky storage", "every error permanent (never retried)", "tasks/kernel.py",
           "                transient=not isinstance(exc, PERMANENT))", "                transient=False)",
           (W + "test_only_io_trouble_is_retried",)),
    Mutant("R2", "Retries with backoff on flaky storage", "missing objects, denied access and arrow errors retried",
           "tasks/kernel.py", "                transient=not isinstance(exc, PERMANENT))",
           "                transient=True)",
           (W + "test_only_io_trouble_is_retried",)),
    Mutant("R3", "Retries with backoff on flaky storage", "Prefect's retry condition retries every failure",
           "tasks/prefect_tasks.py", "    return not isinstance(exc, ShardError) or exc.transient", "    return True",
           (W + "test_only_io_trouble_is_retried",)),
    # ------------------------------------------------------------ clean failure
    Mutant("F1", "Clean failure when storage is down", "a write failure not named by shard and object",
           "tasks/kernel.py", '        raise _fail(relpath, f"writing {uri}", exc) from exc',
           "        raise", (BAD + "[access-denied-writing-the-output]",
                            "tests/test_merge_kernel.py::test_failed_local_write_leaves_no_temp_file[streamed]")),
    Mutant("F2", "Clean failure when storage is down", "the chain's write failure not named by shard and object",
           "tasks/kernel.py", '        raise _fail(relpath, f"writing {job.output_uri(relpath)}", exc) from exc',
           "        raise", ("tests/test_merge_kernel.py::test_failed_local_write_leaves_no_temp_file[chain]",)),
    # ------------------------------------------------------------ no writes outside
    Mutant("W1", "No writes outside the output prefix", "check_relpath accepts '..', '.', empty segments",
           "tasks/storage/__init__.py",
           '    if not relpath or "\\0" in relpath or any(p in ("", ".", "..") for p in parts):', "    if False:",
           (W + "test_check_relpath_refuses_paths_that_could_escape",)),
    Mutant("W2", "No writes outside the output prefix", "write path backstop (check_write_path) does nothing",
           "tasks/storage/backend.py", '        if any(p in (".", "..") for p in path.split("/")):',
           "        if False:", (W + "test_write_atomic_refuses_dot_segments_on_every_backend",)),
    Mutant("W3", "No writes outside the output prefix", "local backstop ignores paths that normalize differently",
           "tasks/storage/local.py", "        if posixpath.normpath(uri) != uri:", "        if False:",
           (W + "test_local_write_refuses_a_path_that_normalizes_differently",)),
    Mutant("W4", "No writes outside the output prefix", "the plan accepts base keys with '..' segments",
           "tasks/plan.py", "    if unsafe:", "    if False:", (BAD + "[dotdot-in-a-key]",)),
    Mutant("W5", "No writes outside the output prefix", "an output prefix inside an input is allowed",
           "tasks/storage/__init__.py", "    return a.startswith(b)", "    return a == b",
           (BAD + "[output-inside-base]", BAD + "[output-inside-source]")),
    # ------------------------------------------------------------ read-only inputs
    Mutant("B1", "Base and sources are read-only", "the merged shard written over the base shard",
           "tasks/kernel.py", "    uri, key = job.output_uri(relpath), job.pipeline.dataset.key_column",
           "    uri, key = job.base_uri(relpath), job.pipeline.dataset.key_column",
           (BAD + "[non-parquet-objects-ignored]",)),
    Mutant("B2", "Base and sources are read-only", "the chain's last step writes over the base shard",
           "tasks/kernel.py", "        written = storage.write_atomic(table.replace_schema_metadata(meta), "
           "job.output_uri(relpath),",
           "        written = storage.write_atomic(table.replace_schema_metadata(meta), job.base_uri(relpath),",
           ("tests/test_fused.py::test_fused_run_equals_the_chain_and_records_one_task_per_shard",)),
    # ------------------------------------------------------------ alignment
    Mutant("L1", "Alignment asserted per shard", "key comparison skipped in the merge op",
           "tasks/ops/alignment.py", "        return self.count > 0", "        return False",
           ("tests/test_merge_kernel.py::test_alignment_errors_name_shard_operation_and_rows",
            "tests/test_property_merge.py::test_merge_is_aligned_or_fails_with_alignment_error")),
    Mutant("L2", "Alignment asserted per shard", "a null key on both sides counts as equal",
           "tasks/ops/alignment.py", "pc.fill_null(pc.equal(left, right), False)",
           "pc.fill_null(pc.equal(left, right), True)",
           ("tests/test_merge_kernel.py::test_null_key_on_both_sides_is_a_mismatch",)),
    Mutant("L3", "Alignment asserted per shard", "row counts not compared", "tasks/ops/alignment.py",
           "    if rows != source_rows:", "    if False:", (BAD + "[row-count-mismatch]",)),
    Mutant("L4", "Alignment asserted per shard", "post-write check (kernel.check_written) does nothing",
           "tasks/kernel.py", "    uri = job.output_uri(relpath)\n    key = job.pipeline.dataset.key_column\n",
           "    return stats\n    uri = job.output_uri(relpath)\n    key = job.pipeline.dataset.key_column\n",
           (W + "test_post_write_check_fails_an_output_the_writer_got_wrong",)),
    Mutant("L5", "Alignment asserted per shard", "post-write check skips the key comparison", "tasks/kernel.py",
           "            if not copied:",
           "            if False:", (W + "test_post_write_check_fails_an_output_the_writer_got_wrong",)),
    Mutant("L6", "Alignment asserted per shard", "post-write check skips the fingerprint", "tasks/kernel.py",
           "            if not prov or not job.pipeline.accepts(prov.get(\"fingerprint\")):",
           "            if False:", (W + "test_post_write_check_fails_an_output_the_writer_got_wrong",)),
    Mutant("L7", "Alignment asserted per shard", "the write step does not check what it stored", "tasks/kernel.py",
           "    return check_written(job, relpath, stats, written.payload, state.key_batches())", "    return stats",
           (W + "test_a_run_fails_the_shard_whose_output_fails_the_check",)),
    Mutant("L8", "Alignment asserted per shard", "the check compares the written keys with the table's own, not the "
           "base's as read", "tasks/kernel.py", "state.base_input, state.base_keys)",
           "state.base_input, table[job.pipeline.dataset.key_column])",
           ("tests/test_s3_requests.py::test_the_check_compares_with_the_base_keys_as_read_not_the_tables",)),
    Mutant("L9", "Alignment asserted per shard", "a retry trusts the output it finds (no check)",
           "tasks/prefect_tasks.py", "    stats = kernel.check_written(job, relpath, found, base_keys=base_keys)",
           "    stats = found",
           ("tests/test_fused.py::test_a_retry_runs_the_post_write_check_on_the_output_it_returns",)),
    Mutant("L10", "Alignment asserted per shard", "an upload S3 stored damaged is taken for the bytes sent",
           "tasks/storage/s3.py", "    if etag and not encrypted:", "    if False:",
           ("tests/test_s3_requests.py::test_an_upload_corrupted_on_the_way_is_never_taken_for_written",)),
    # ------------------------------------------------------------ memory
    Mutant("L11", "Alignment asserted per shard", "the streamed write does not check what it stored", "tasks/kernel.py",
           "    return check_written(job, relpath, stats, payload, keys, schema, (shard.file, shard.base.file))",
           "    return stats",
           (W + "test_a_run_fails_the_shard_whose_output_fails_the_check",)),
    Mutant("L12", "Alignment asserted per shard", "the streamed check reads the base's keys anew by path, not again "
           "from the open base file (another request; not the bytes read)", "tasks/kernel.py",
           "    keys = shard.base.reread(key) if key in shard.base.schema.names else None", "    keys = None",
           ("tests/test_s3_requests.py::test_a_run_reads_each_input_as_listed_and_never_reads_its_output_back",)),
    Mutant("L13", "Alignment asserted per shard", "a streamed shard's mismatches after its first window ignored",
           "tasks/ops/alignment.py", "        self.count += count", "        self.count += count if not offset else 0",
           ("tests/test_streaming.py::test_streamed_equals_whole_across_window_boundaries",)),
    Mutant("L14", "Alignment asserted per shard", "post-write key check passes a null written key (pc.equal alone)",
           "tasks/kernel.py", "    return pc.all(pc.or_(equal, pc.and_(pc.is_null(a), pc.is_null(b))), min_count=0).as_py()",
           "    return pc.all(pc.equal(a, b), min_count=0).as_py()",
           ("tests/test_post_write_keys.py::test_a_null_written_where_the_base_has_a_key_fails_the_check",)),
    Mutant("M1", "Memory bounded by a window budget", "the streamed merge takes the whole shard as one window",
           "tasks/kernel.py",
           "        size = window_rows(shard.natural_rows, window.nbytes / max(window.num_rows, 1), job.window_bytes)",
           "        size = shard.rows or 1",
           ("tests/test_streaming.py::test_a_streamed_shard_holds_a_window_not_the_shard",)),
    Mutant("M2", "Memory bounded by a window budget", "a local file's row group is read whole (pre-buffered)",
           "tasks/windows.py", "        return pq.ParquetFile(f, buffer_size=READ_BUFFER, pre_buffer=False)",
           "        return pq.ParquetFile(f)",
           ("tests/test_streaming.py::test_a_streamed_shard_holds_a_window_not_the_shard",)),
    Mutant("M3", "Memory bounded by a window budget", "the merge holds the window written while it reads the next",
           "tasks/kernel.py",
           "            start, window = next(starts, None), None  # one window held at a time: this one goes first",
           "            start, held = next(starts, None), window\n            window = None",
           ("tests/test_streaming.py::test_memory_grows_with_the_budget_by_one_window_held_at_a_time",)),
    # ------------------------------------------------------------ resume
    Mutant("S1", "Resume trusts only current outputs", "the planner trusts a stale output (input key ignored)",
           "tasks/plan.py", '    if prov.get("input_key") != shard_key(prov["fingerprint"], relpath, inputs):',
           "    if False:", ("tests/test_resume_inputs.py::test_changed_source_rewrites_exactly_that_shard",)),
    Mutant("S2", "Resume trusts only current outputs", "the shard key ignores input identities", "tasks/kernel.py",
           '                       "inputs": inputs}, sort_keys=True)',
           '                       "inputs": None}, sort_keys=True)',
           ("tests/test_resume_inputs.py::test_changed_source_rewrites_exactly_that_shard",)),
    Mutant("S3", "Resume trusts only current outputs", "an --overwrite retry keeps the previous run's output",
           "tasks/prefect_tasks.py", "(job.overwrite and not job.kept_by_overwrite(prov))", "False",
           ("tests/test_retry_cached.py::test_overwrite_retry_never_keeps_the_previous_output",)),
    Mutant("S4", "Resume trusts only current outputs", "the planner trusts an output whose row count differs from "
           "the one its provenance records", "tasks/plan.py", '    if meta.num_rows != prov.get("rows"):',
           "    if False:", ("tests/test_provenance_trust.py::test_an_output_cut_short_with_its_provenance_kept_is_recomputed",)),
    Mutant("S5", "Resume trusts only current outputs", "provenance taken as it is (not an object, wrong-typed "
           "fields)", "tasks/kernel.py", "    problem = provenance_problem(prov)", '    problem = ""',
           ("tests/test_provenance_trust.py::test_malformed_provenance_is_foreign_refused_then_replaced_by_overwrite",)),
    # ------------------------------------------------------------ identity
    Mutant("I1", "Input identity never newer than the data", "local identity taken by path after the open",
           "tasks/storage/local.py",
           "        return local_identity(os.fstat(opened.fileno()) if opened is not None else os.stat(uri))",
           "        return local_identity(os.stat(uri))",
           ("tests/test_identity_pinned.py::test_replace_between_open_and_identity_never_records_the_newer_identity",)),
    Mutant("I2", "Input identity never newer than the data", "an S3 file opened with a listed size not pinned",
           "tasks/storage/s3.py", "            if opened is not None:\n                pin(opened, details)",
           "            pass",
           ("tests/test_identity_pinned.py::test_s3_file_opened_with_a_listed_size_is_pinned_when_its_identity_"
            "is_taken",)),
    Mutant("I3", "Input identity never newer than the data", "a file opened as listed reads unpinned (any version)",
           "tasks/storage/s3.py", '        pin(f, {**f.details, "ETag": etag})', '        f.details = {**f.details, "ETag": etag}',
           ("tests/test_s3_requests.py::test_an_input_replaced_after_the_plan_is_read_again_by_the_retry",)),
    Mutant("I4", "Input identity never newer than the data", "a retry reads under the plan's listing again (a "
           "replaced input fails every attempt)", "tasks/prefect_tasks.py",
           "    return storage.listed(listed if first and listed else {})",
           "    return storage.listed(listed or {})",
           ("tests/test_s3_requests.py::test_an_input_replaced_after_the_plan_is_read_again_by_the_retry",)),
    # ------------------------------------------------------------ stale never current
    Mutant("V1", "A stale output is never reported or verified as current", "verify's `current inputs` check "
           "does nothing", "tasks/verification/checks.py",
           '    if prov.get("input_key") != shard_key(prov["fingerprint"], footers.relpath, footers.inputs):',
           "    if False:",
           ("tests/test_stale_recompute.py::test_failed_recompute_of_a_stale_output_is_reported_and_fails_verify",)),
    # ------------------------------------------------------------ interrupted
    Mutant("N1", "One way to be interrupted", "the shard window ignores a requested stop (SIGINT/SIGTERM, "
           "fail-fast): every shard is still submitted", "flows/scheduler.py",
           "            if stop.requested:\n                break\n", "",
           ("tests/test_interrupt.py::test_a_signal_stops_new_shards_finishes_the_one_in_flight_and_says_so[SIGINT]",
            "tests/test_flow_local.py::test_fail_fast_stops_submitting")),
    Mutant("N2", "One way to be interrupted", "an interrupted --overwrite cannot be continued: nothing it wrote "
           "counts as done", "tasks/kernel.py",
           "        if self.overwrite_id and prov.get(\"overwrite_id\") == self.overwrite_id:\n            return True\n",
           "",
           ("tests/test_interrupt.py::test_an_interrupted_overwrite_continues_with_what_its_summary_says[SIGINT]",
            "tests/test_overwrite_continue.py::test_an_overwrite_continued_replaces_every_old_output_whatever_the_clocks")),
    Mutant("N4", "One way to be interrupted", "--overwrite-before ignores the zone it names", "flows/runconfig.py",
           "    return when.astimezone(timezone.utc).isoformat(timespec=\"microseconds\")",
           "    return when.replace(tzinfo=timezone.utc).isoformat(timespec=\"microseconds\")",
           ("tests/test_provenance_trust.py::test_overwrite_before_honours_the_zone_it_names",)),
    Mutant("N5", "One way to be interrupted", "--overwrite-before trusts a recorded start without a zone",
           "tasks/kernel.py", "        return bool(started and before and started.tzinfo and started >= before)",
           "        return bool(started and before and started.replace(tzinfo=before.tzinfo) >= before)",
           ("tests/test_provenance_trust.py::test_a_run_started_without_a_zone_is_not_trusted_by_overwrite_before",)),
    Mutant("N3", "One way to be interrupted", "a signal during verify ends it with a partial report",
           "flows/verify.py",
           "        if stop.by_signal and (window.abandoned or window.submitted < len(shards)):\n"
           "            raise Interrupted(stop.reason)\n", "",
           ("tests/test_interrupt.py::test_a_signal_during_verify_ends_it_incomplete_not_passed",)),
    Mutant("G1", "One way to be interrupted", "a second signal waits out the grace period like the first",
           "flows/interrupt.py", "            stop.request(name, grace=0.0 if again else self.grace)",
           "            stop.request(name, grace=self.grace)",
           ("tests/test_interrupt_process.py::test_a_second_signal_abandons_the_shard_in_flight_at_once",)),
    Mutant("G2", "One way to be interrupted", "Prefect's and Ray's own SIGTERM handlers replace the run's",
           "flows/interrupt.py", "    signal.signal = _others_refused\n", "",
           (SIG + "test_libraries_cannot_replace_the_runs_signal_handler",
            SIG + "test_a_signal_as_the_flow_run_starts_cancels_it_before_any_shard")),
    Mutant("G3", "One way to be interrupted", "a write abandoned when the grace runs out leaves its temp file",
           "flows/merge.py", "    abandon_writes()\n", "",
           ("tests/test_interrupt_process.py::test_a_grace_period_that_runs_out_during_a_write_takes_the_write_back",)),
    Mutant("G4", "One way to be interrupted", "a signal during the summary is taken as a request to stop",
           "flows/interrupt.py", "        if self.phase == OVER or (stop is not None and stop.done):",
           "        if self.phase == OVER:",
           (SIG + "test_a_signal_during_the_summary_leaves_the_exit_code_the_work_earned[all-merged]",)),
    Mutant("G5", "One way to be interrupted", "a signal while planning lets planning go on to its end",
           "flows/interrupt.py", "        elif self.phase == STARTING or (stop is not None and stop.at_once):",
           "        elif self.phase == STARTING:", (SIG + "test_a_signal_while_planning_ends_the_run_at_once",)),
    Mutant("G6", "One way to be interrupted", "--grace-seconds accepts infinity and more than a day",
           "flows/interrupt.py", "    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_GRACE):",
           "    if not 0 <= seconds:", (SIG + "test_grace_seconds_is_a_finite_number_from_0_to_a_day[inf]",)),
    # ------------------------------------------------------------ nothing dropped
    Mutant("D1", "Nothing dropped silently", "an empty (0-byte) base shard dropped by the listing",
           "tasks/storage/__init__.py", '        if rel.endswith(".parquet"):',
           '        if rel.endswith(".parquet") and size > 0:', (BAD + "[zero-byte-base-shard-fails]",)),
    Mutant("D2", "Nothing dropped silently", "an optional operation matching no shard accepted as a no-op",
           "tasks/plan.py", "    if lines := plan.unmatched_optional():", "    if False:",
           (BAD + "[optional-source-matching-nothing]",)),
    # ------------------------------------------------------------ keys
    Mutant("K1", "Keys compare without conversion", "keys of different types compared as text",
           "tasks/ops/alignment.py", "    if left.type == right.type:\n        return left, right\n",
           "    if left.type != right.type:\n        return left.cast(pa.string()), right.cast(pa.string())\n",
           ("tests/test_property_merge.py::test_zero_padded_text_never_aligns_with_a_number",)),
    # ------------------------------------------------------------ concurrent writers
    Mutant("C1", "Concurrent runs never mix writers", "two writers of one shard share a temp file name",
           "tasks/storage/local.py", "{os.getpid()}-{uuid.uuid4().hex}", "{os.getpid()}-0",
           (W + "test_two_interleaved_writers_of_one_shard_leave_one_whole_file",)),
    # ------------------------------------------------------------ credentials
    Mutant("X1", "Credentials never leave the environment", "the secret key written to the summary artifact",
           "flows/artifacts.py", '                             description=f"merge of {pipeline}")',
           '                             description=f"merge of {pipeline} '
           '{__import__(\'os\').environ.get(\'AWS_SECRET_ACCESS_KEY\')}")',
           ("tests/test_secrets.py::test_in_process_run_leaves_no_credential_in_the_api",)),
    Mutant("X2", "Credentials never leave the environment", "credentials forwarded to remote workers",
           "tasks/storage/__init__.py", "    return tuple(dict.fromkeys(name for b in (S3, LOCAL) for name in "
           "b.env_names))", "    return tuple(dict.fromkeys(name for b in (S3, LOCAL) for name in b.env_names)) "
           "+ ('AWS_SECRET_ACCESS_KEY',)",
           ("tests/test_storage_backends.py::test_worker_env_names_are_settings_never_credentials",)),
    Mutant("P1", "Every task run's logs reach the API on a cluster", "a Ray task's logs left to Prefect's log worker",
           "flows/runners.py", "            compat.route_api_logs(_hold_log)", "            pass",
           ("tests/test_cluster_logs.py::test_every_task_runs_logs_reach_the_api_with_prefects_batch_interval",)),
    # ------------------------------------------------------------ weak tests made strong (issue 18)
    Mutant("T1", "(test) fused: one task run per shard", "a duplicate task run per shard", "flows/merge.py",
           '            return [self.runner.submit(self.whole, {"job": self.job, "relpath": relpath, "listed": listed})]',
           '            self.runner.submit(self.whole, {"job": self.job, "relpath": relpath, "listed": listed}).wait()\n'
           '            return [self.runner.submit(self.whole, {"job": self.job, "relpath": relpath, "listed": listed})]',
           ("tests/test_fused.py::test_fused_run_equals_the_chain_and_records_one_task_per_shard",)),
    Mutant("T2", "(test) the module map names every module", "tasks/kernel.py missing from the map",
           "docs/architecture.md", "| `tasks/kernel.py` |", "| `tasks/shard_kernel.py` |",
           ("tests/test_layers.py::test_the_module_map_names_every_module",)),
    # ------------------------------------------------------------ the run's check (issue 28)
    Mutant("E1", "A merge run ends checked", "objects under the output prefix that are not shards go unnoticed",
           "tasks/runcheck.py", "    extra = sorted([rel for rel in fresh.shards if rel not in base] + others)",
           "    extra = sorted([rel for rel in fresh.shards if rel not in base])",
           (RC + "test_anything_else_under_the_output_prefix_fails_the_check[local-notes.txt]",)),
    Mutant("E2", "A merge run ends checked", "a failed run check does not fail the run", "tasks/prefect_tasks.py",
           "    if not check.ok:", "    if False:", (RC + "test_an_extra_shard_fails_the_run_and_its_check_task[local]",)),
    Mutant("E3", "A merge run ends checked", "a kept output replaced after the plan listed it passes",
           "tasks/runcheck.py", "            if fresh.ids.get(rel) != plan.output.ids.get(rel):",
           "            if False:", (RC + "test_kept_outputs_are_judged_by_the_identity_the_plan_listed[local]",)),
    # ------------------------------------------------------------ the copy path (tasks/chunkcopy.py)
    Mutant("Y1", "Copied bytes are the base's bytes", "a copied chunk's offsets one byte off where it was placed",
           "tasks/chunkcopy.py", "footer.moved(chunk, position - length, [name",
           "footer.moved(chunk, position - length + 1, [name",
           (CC + "test_the_copy_reads_back_as_the_decode_paths_output",)),
    Mutant("Y2", "Copied bytes are the base's bytes", "a chunk copied from its first data page (its dictionary "
           "page left behind)", "tasks/footer.py", "        start = meta.dictionary_page_offset\n",
           "        pass\n", (CC + "test_the_copy_reads_back_as_the_decode_paths_output",)),
    Mutant("Y3", "Keys still proven on the copy path", "the copy path's key check skipped", "tasks/kernel.py",
           "    chunkcopy.check_steps(plan, step_failed)", "    (lambda *_: None)(plan, step_failed)",
           (CC + "test_a_misaligned_sibling_fails_the_copy_before_anything_is_written",
            "tests/test_merge_kernel.py::test_alignment_errors_name_shard_operation_and_rows")),
    Mutant("Y4", "Keys still proven on the copy path", "the post-write check takes a copied key chunk's bytes as "
           "equal without comparing them", "tasks/chunkcopy.py", "        if n and not pa.py_buffer(x[:n]).equals(pa.py_buffer(y[:n])):",
           "        if False:", (CC + "test_the_check_compares_copied_key_chunks_byte_for_byte",)),
    Mutant("Y5", "Copied bytes are the base's bytes", "a stitched chunk's null count is its first piece's",
           "tasks/footer.py", "        merged[NULL_COUNT] = sum(s[NULL_COUNT] for s in stats)",
           "        merged[NULL_COUNT] = stats[0][NULL_COUNT]",
           (CC + "test_scores_of_a_row_group_larger_than_a_piece_are_encoded_in_pieces_into_one_chunk",)),
    Mutant("Y6", "Memory bounded by a window budget", "a score column encoded a whole row group at once where the "
           "base's row group is larger than a piece", "tasks/chunkcopy.py",
           "    if max(p.sources[0].groups) <= PIECE_ROWS:", "    if True:",
           (CC + "test_scores_of_a_row_group_larger_than_a_piece_are_encoded_in_pieces_into_one_chunk",
            CC + "test_scores_encoded_into_larger_row_groups_hold_a_piece_not_the_row_group")),
    Mutant("Y7", "Keys still proven on the copy path", "keys stored as the same bytes taken as equal though a "
           "chunk holds a null key (statistics not asked)", "tasks/chunkcopy.py",
           "    if leaf is None or not (meta.schema.column(leaf).max_definition_level == 0 or all(\n"
           "            _no_null(meta.row_group(g).column(leaf)) for g in range(meta.num_row_groups))):",
           "    if leaf is None:",
           (CC + "test_a_null_key_stored_alike_in_base_and_sibling_is_still_a_mismatch",)),
    # ------------------------------------------------------------ issue 34: the edges of the promises
    Mutant("A5", "Atomic shards", "a local write stopped by Ctrl-C or SystemExit leaves its temp file (clean-up on "
           "Exception only)", "tasks/storage/local.py",
           "            except BaseException:\n                temp.remove()",
           "            except Exception:\n                temp.remove()",
           ("tests/test_interrupted_write.py::test_a_write_stream_interrupted_half_way_leaves_no_temp_file",
            "tests/test_interrupted_write.py::test_a_shard_merge_interrupted_while_writing_leaves_no_temp_file")),
    Mutant("M4", "Memory bounded by a window budget", "fetch-ahead evicts one object where several must go (150 "
           "bytes held under a 100-byte budget)", "tasks/storage/ahead.py",
           "        while _waiting and _held() + held > BUDGET:", "        if _waiting and _held() + held > BUDGET:",
           ("tests/test_fetch_ahead.py::test_the_bytes_held_never_exceed_the_budget_after_any_fetch",)),
    Mutant("M5", "Memory bounded by a window budget", "a shard's fetches ahead ignore its window budget (each input "
           "fetched whole)", "tasks/kernel.py", "        room -= storage.fetch_ahead(uri, wanted, room)",
           "        storage.fetch_ahead(uri, wanted)",
           ("tests/test_fetch_ahead.py::test_a_shards_inputs_share_its_window_budget_siblings_first",)),
    Mutant("M6", "Memory bounded by a window budget", "a limited fetch fetches every wanted chunk whatever its limit",
           "tasks/storage/ahead.py", "    parts, room = [], (size if limit is None else limit) - len(tail)",
           "    parts, room = [], size",
           ("tests/test_fetch_ahead.py::test_a_limited_fetch_holds_its_tail_and_the_first_wanted_bytes_that_fit",)),
    Mutant("E4", "A merge run ends checked", "one output per base shard checked only for the shards the run merged "
           "(a kept output deleted passes)", "tasks/runcheck.py",
           "    missing = [rel for rel in base if rel not in fresh.shards]",
           "    missing = [rel for rel in base if rel not in fresh.shards and rel in merged]",
           (RC + "test_a_kept_output_deleted_before_the_check_fails_it",)),
    Mutant("N6", "One way to be interrupted", "a stop that abandoned every shard in flight, all submitted, reported "
           "as a run that finished (Completed, exit 0)", "flows/merge.py",
           '    if not_started or window.abandoned or stop.reason == "--fail-fast":',
           '    if not_started or stop.reason == "--fail-fast":',
           ("tests/test_interrupt_all_submitted.py::"
            "test_a_signal_once_every_shard_is_submitted_abandons_them_all_and_none_writes_after",)),
    Mutant("N7", "One way to be interrupted", "a shard abandoned while it still read writes its output after the "
           "summary (the run's writes not closed)", "tasks/storage/inflight.py",
           "        late = run is not None and run.closed", "        late = False",
           ("tests/test_run_writes.py::test_a_write_starting_after_its_run_abandoned_its_writes_never_publishes",
            "tests/test_interrupt_all_submitted.py::"
            "test_a_signal_once_every_shard_is_submitted_abandons_them_all_and_none_writes_after")),
    Mutant("G7", "One way to be interrupted", "the work counted done only after the run's check (a signal during "
           "the check taken as a request to stop)", "flows/merge.py",
           '            stop.done = True  # a signal from now on changes nothing\n            if window.abandoned:\n                abandon(runner)\n    stop.done = True\n    not_started = len(plan.todo) - window.submitted\n    if not_started or window.abandoned or stop.reason == "--fail-fast":  # else the stop left nothing undone\n        summary.stopped(stop.reason, not_started=not_started, abandoned=window.abandoned)\n    progress.close()\n    if not summary.failed and not summary.stop_reason:\n        check_outputs(RunOutcome(plan, merged), summary)\n',
           '            if window.abandoned:\n                abandon(runner)\n    not_started = len(plan.todo) - window.submitted\n    if not_started or window.abandoned or stop.reason == "--fail-fast":  # else the stop left nothing undone\n        summary.stopped(stop.reason, not_started=not_started, abandoned=window.abandoned)\n    progress.close()\n    if not summary.failed and not summary.stop_reason:\n        check_outputs(RunOutcome(plan, merged), summary)\n    stop.done = True\n',
           (SIG + "test_a_signal_during_the_run_check_leaves_the_exit_code_the_work_earned",)),
    Mutant("S6", "Resume trusts only current outputs", "the planner trusts an output with more rows than its "
           "provenance records (only fewer caught)", "tasks/plan.py",
           '    if meta.num_rows != prov.get("rows"):', '    if meta.num_rows < prov.get("rows"):',
           ("tests/test_provenance_trust.py::test_an_output_with_a_row_more_than_its_provenance_records_is_recomputed",)),
    Mutant("V2", "Verify judges more and fewer alike", "verify's row counts catch only missing rows (a duplicated "
           "row passes)", "tasks/verification/checks.py",
           "    if footers.out_rows != footers.base_rows:", "    if footers.out_rows < footers.base_rows:",
           ("tests/test_verify.py::test_one_row_duplicated",)),
    Mutant("V3", "Verify judges more and fewer alike", "a value check's flagged rows counted per window, not over "
           "the shard (a NaN in the first window only is lost)", "tasks/verification/values.py",
           "        flagged = self.streams.flagged.setdefault((name, what), Flagged(name, what, self.streams.rows))",
           "        flagged = Flagged(name, what, self.streams.rows)",
           ("tests/test_verify_windows.py::test_a_nan_score_is_counted_over_the_shard_whatever_the_window",)),
    Mutant("V4", "Verify judges more and fewer alike", "a sibling with more rows than the output read as aligned "
           "(only fewer caught)", "tasks/verification/values.py",
           "        if pf.metadata.num_rows != self.rows:", "        if pf.metadata.num_rows < self.rows:",
           ("tests/test_verify_windows.py::test_a_sibling_with_other_row_counts_fails_alignment_in_every_window_size",)),
    Mutant("V6", "Verify's driver keeps problems, not shards", "the fold keeps every shard's footer facts, not only "
           "the statistics' scope's", "tasks/verification/driver.py", "        if fact.relpath in self.scope:",
           "        if True:",
           ("tests/test_verify_driver.py::test_the_fold_keeps_counts_problems_and_the_scope_only",
            "tests/test_verify_driver.py::test_the_driver_holds_the_listings_not_the_footers")),
    Mutant("V7", "Verify's driver keeps problems, not shards", "footers read through pyarrow's FileMetaData.schema "
           "(a cycle only a full collection frees)", "tasks/verification/footers.py",
           "        out_meta, out_schema = storage.read_footer_schema(job.output_uri(relpath), sizes[1])",
           "        out_meta = storage.read_footer(job.output_uri(relpath), sizes[1])\n"
           "        out_schema = out_meta.schema.to_arrow_schema()",
           ("tests/test_verify_driver.py::test_footer_reads_leave_no_garbage_only_a_full_collection_frees",)),
    Mutant("V8", "One way to be interrupted", "verify's footer reads ignore the run's stop (a signal after the shard "
           "checks waits for every footer, then passes)", "tasks/verification/driver.py",
           "                if not self._stopped and self.halted():", "                if False:",
           ("tests/test_verify_driver.py::test_verify_halted_stops_the_footer_reads_and_raises",
            "tests/test_interrupt.py::test_a_signal_while_footers_are_read_ends_verify_incomplete_without_reading_the_rest")),
    Mutant("V5", "A stale output is never reported or verified as current", "stale outputs a stopped run never "
           "reached left out of the summary's count (reported as if every one was recomputed)", "tasks/summary.py",
           "        untouched = self.stale - self.stale_recomputed - failed", "        untouched = 0",
           ("tests/test_stale_recompute.py::"
            "test_stale_outputs_a_stopped_run_never_reached_are_unfinished_not_recomputed",)),
    Mutant("F3", "Clean failure when storage is down", "any error of a listing task refused as configuration (a "
           "TypeError of ours read as exit 2)", "tasks/plan.py",
           "    except storage.store_errors() as exc:", "    except Exception as exc:",
           ("tests/test_listing_errors.py::test_a_bug_of_ours_in_the_listing_is_not_a_refusal",)),
    Mutant("F4", "Clean failure when storage is down", "an unreachable endpoint waited for with botocore's own "
           "backoff (~55 s a listing)", "tasks/storage/s3.py",
           '    session.register("needs-retry.s3", connect_retry(attempts))', "    pass",
           ("tests/test_listing_errors.py::test_a_listing_of_a_store_that_does_not_answer_fails_after_every_attempt_"
            "with_short_waits",)),
    Mutant("F5", "Clean failure when storage is down", "the last connection retry left to botocore's backoff (up to "
           "20 s more a request)", "tasks/storage/s3.py",
           "and attempts <= max_attempts:", "and attempts < max_attempts:",
           ("tests/test_listing_errors.py::test_a_listing_of_a_store_that_does_not_answer_fails_after_every_attempt_"
            "with_short_waits",)),
]


def repo_files() -> list[str]:
    """Tracked and untracked (not ignored) files that exist now: the working tree as others see it."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return sorted({f for f in out.split("\0") if f and (ROOT / f).is_file()})


def copy_repo(dest: Path) -> None:
    for rel in repo_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def env_for(copy: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports(copy: Path) -> None:
    """The copy's modules, not the shared tree's (an editable install points there), are the ones imported."""
    code = "import tasks, flows; print(tasks.__file__); print(flows.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=copy, env=env_for(copy), capture_output=True,
                         text=True, check=True).stdout.split()
    bad = [p for p in out if not Path(p).resolve().is_relative_to(copy.resolve())]
    if bad:
        sys.exit(f"imports resolve outside the copy: {bad}")


def pytest(copy: Path, tests: list[str], stop_first: bool, xml: Path | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--strict-markers",
            "--timeout=300", *(["-x"] if stop_first else []), *([f"--junitxml={xml}"] if xml else []), *tests]
    return subprocess.run(argv, cwd=copy, env=env_for(copy), capture_output=True, text=True, timeout=1800)


def failed_in(xml: Path) -> set[str]:
    """Test node ids (file::name[param]) that failed or errored in a junit report."""
    out = set()
    for case in ET.parse(xml).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            path = case.get("classname", "").replace(".", "/") + ".py"
            out.add(f"{path}::{case.get('name')}")
    return out


def matches(selector: str, node: str) -> bool:
    return node == selector or node.startswith(selector + "[")


def run(mutants: list[Mutant], verbose: bool) -> list[tuple[Mutant, str, float]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="sidecar-mutants-") as tmp:
        copy = Path(tmp) / "repo"
        copy_repo(copy)
        check_imports(copy)
        selectors = sorted({t for m in mutants for t in m.tests})
        xml = Path(tmp) / "baseline.xml"
        start = time.monotonic()
        base = pytest(copy, selectors, stop_first=False, xml=xml)
        broken = failed_in(xml) if xml.exists() else set(selectors)
        print(f"baseline (unmutated copy, {len(selectors)} test selectors): exit {base.returncode}, "
              f"{time.monotonic() - start:.0f}s", flush=True)
        if base.returncode not in (0, 1) and not broken:
            print(base.stdout[-3000:], base.stderr[-3000:])
        for m in mutants:
            path = copy / m.file
            text = path.read_text()
            if text.count(m.original) != 1:
                results.append((m, f"INVALID (original text found {text.count(m.original)} times)", 0.0))
                print(f"{m.id}: {results[-1][1]}", flush=True)
                continue
            if any(matches(t, n) for t in m.tests for n in broken):
                results.append((m, "INVALID (fails unmutated)", 0.0))
                print(f"{m.id}: {results[-1][1]}", flush=True)
                continue
            path.write_text(text.replace(m.original, m.replacement))
            start = time.monotonic()
            try:
                proc = pytest(copy, list(m.tests), stop_first=True)
                outcome = "killed" if proc.returncode != 0 else "SURVIVED"
            except subprocess.TimeoutExpired:
                proc, outcome = None, "killed (timeout)"
            finally:
                path.write_text(text)
            took = time.monotonic() - start
            results.append((m, outcome, took))
            print(f"{m.id}: {outcome} in {took:.0f}s  ({m.what})", flush=True)
            if verbose and proc is not None:
                print(proc.stdout[-1500:])
    return results


def table(results) -> str:
    lines = ["| id | guarantee | mutant | file | killed by | result |", "|---|---|---|---|---|---|"]
    for m, outcome, _ in results:
        tests = "<br>".join(f"`{t}`" for t in m.tests)
        lines.append(f"| {m.id} | {m.guarantee} | {m.what} | `{m.file}` | {tests} | {outcome} |")
    return "\n".join(lines)


def write_doc(text: str, begin: str = BEGIN, end: str = END) -> None:
    """`text` between the markers `begin` and `end` of docs/guarantees.md (tests/mutation_score.py uses it too)."""
    doc = DOC.read_text()
    head, _, rest = doc.partition(begin)
    _, _, tail = rest.partition(end)
    DOC.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*", help="mutant ids (default: all)")
    parser.add_argument("--write-doc", action="store_true", help="rewrite the table in docs/guarantees.md")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.ids or m.id in args.ids]
    start = time.monotonic()
    results = run(chosen, args.verbose)
    text = table(results)
    print(text)
    print(f"{sum(o.startswith('killed') for _, o, _ in results)} of {len(results)} killed in "
          f"{time.monotonic() - start:.0f}s")
    if args.write_doc and not args.ids:
        write_doc(text)
    return 0 if all(o.startswith("killed") for _, o, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
