// /jobs/:jobId: one job, live. The job is asked for every 10 s while it runs, at once on a status
// change and shortly after a candidate's next epoch starts; its metrics every 10 s; everything
// once more when it ends.
import { useCallback, useEffect, useMemo, useRef } from "react";
import { Link, useParams } from "react-router-dom";
import { useQuery, useQueryClient } from "@tanstack/react-query";
import { api, must, type Schemas } from "../api/client";
import { ApiError } from "../api/errors";
import { ErrorNote, Loading, QueryState } from "../components/states";
import { CheckpointsTable } from "./job/Checkpoints";
import { JobHeader } from "./job/Header";
import { Logs } from "./job/Logs";
import { LeaderboardSection } from "./job/Leaderboard";
import { candidateSeries, trainingSeries } from "./job/metrics";
import { isBakeoff, isTerminal, keys, type Job } from "./job/model";
import { Plan } from "./job/Plan";
import { ServedAcceptance } from "./job/ServedAcceptance";
import { Timeline } from "./job/Timeline";
import { TrainingCharts } from "./job/TrainingCharts";
import { useJobEvents } from "./job/useJobEvents";
import "./JobDetail.css";

type MetricPage = Schemas["Page_MetricOut_"];

// A live job page asks for the job, its new metrics and (after events) its checkpoints this
// often: with its two streams (events, log), under 20 requests a minute.
const LIVE_POLL_MS = 10_000;
// A candidate's next epoch shows its progress (steps of all, the time left) once its first steps
// are recorded: the job is read this long after the event, since a short epoch could otherwise
// pass unseen between two reads.
const EPOCH_SETTLE_MS = 2_000;

function isNextEpoch(event: { kind: string; data?: Record<string, unknown> | null }): boolean {
  return event.kind === "epoch" && event.data?.status === "started" && Number(event.data?.epoch) >= 1;
}

function JobPage({ job }: { job: Job }) {
  const queryClient = useQueryClient();
  const running = !isTerminal(job.status);
  const { events, connection, error } = useJobEvents(job.id);

  // While it runs the job is read again once LIVE_POLL_MS have passed since it was last read
  // (its training's progress moves without events), its checkpoints too when events came since;
  // at once on a status change, and shortly after a candidate's next epoch starts. A read for an
  // event puts the next poll off: the page asks about as often however many events come.
  const newest = events.length ? events[events.length - 1] : null;
  const newestId = useRef<number | null>(null);
  newestId.current = newest?.id ?? null;
  const lastRead = useRef(Date.now());
  const readJob = useCallback(() => {
    lastRead.current = Date.now();
    queryClient.invalidateQueries({ queryKey: keys.job(job.id), exact: true });
  }, [job.id, queryClient]);
  useEffect(() => {
    if (!running) return;
    let seen = newestId.current;
    const timer = setInterval(() => {
      if (Date.now() - lastRead.current < LIVE_POLL_MS) return;
      readJob();
      if (newestId.current !== seen) queryClient.invalidateQueries({ queryKey: keys.checkpoints(job.id) });
      seen = newestId.current;
    }, 1_000);
    return () => clearInterval(timer);
  }, [running, job.id, queryClient, readJob]);
  useEffect(() => {
    if (newest?.kind === "status") readJob();
  }, [newest, readJob]);
  const scanned = useRef(0);
  const settle = useRef<number | undefined>(undefined);
  useEffect(() => () => window.clearTimeout(settle.current), []);
  useEffect(() => {
    const fresh = events.slice(scanned.current);
    scanned.current = events.length;
    if (!running || !fresh.some(isNextEpoch)) return;
    window.clearTimeout(settle.current);
    settle.current = window.setTimeout(readJob, EPOCH_SETTLE_MS);
  }, [events, running, readJob]);

  // When it ends while shown: everything once more (the last metrics, log lines, evaluation).
  const wasRunning = useRef(running);
  useEffect(() => {
    if (wasRunning.current && !running) queryClient.invalidateQueries({ queryKey: keys.job(job.id) });
    wasRunning.current = running;
  }, [running, job.id, queryClient]);

  // Fetched whole once, then only what was recorded after the last one (the page's last_id).
  const metrics = useQuery({
    queryKey: keys.metrics(job.id),
    queryFn: async () => {
      const previous = queryClient.getQueryData<MetricPage>(keys.metrics(job.id));
      const after = previous?.last_id != null ? Number(previous.last_id) : undefined;
      const page = await must(
        api.GET("/api/jobs/{job_id}/metrics", { params: { path: { job_id: job.id }, query: { after } } }),
      );
      return previous && after !== undefined ? { ...page, data: [...previous.data, ...page.data] } : page;
    },
    refetchInterval: running ? LIVE_POLL_MS : false,
  });
  const series = useMemo(() => trainingSeries(metrics.data?.data ?? []), [metrics.data]);
  // A bake-off's metrics say which candidate's trainer logged them: a series each.
  const bakeoff = isBakeoff(job);
  const perCandidate = useMemo(
    () => (bakeoff ? candidateSeries(metrics.data?.data ?? [], job.candidates) : undefined),
    [bakeoff, job.candidates, metrics.data],
  );

  const checkpoints = useQuery({
    queryKey: keys.checkpoints(job.id),
    queryFn: () => must(api.GET("/api/jobs/{job_id}/checkpoints", { params: { path: { job_id: job.id } } })),
    // A publish under way is finished by a worker: look again until it is done.
    refetchInterval: (query) =>
      query.state.data?.data.some((c) => c.publish_status === "publishing") ? 3000 : false,
  });

  return (
    <div className="job-detail">
      <p className="crumbs">
        <Link to="/jobs">← Jobs</Link>
      </p>
      <JobHeader job={job} />

      {bakeoff && <LeaderboardSection job={job} checkpoints={checkpoints.data?.data} />}

      <ServedAcceptance job={job} checkpoints={checkpoints.data?.data} servedPositions={series.servedPositions} />

      <section aria-labelledby="training-title" className="training">
        <h2 id="training-title">Training</h2>
        {metrics.isPending ? (
          <Loading what="Loading metrics" />
        ) : metrics.error ? (
          <ErrorNote error={metrics.error} retry={() => metrics.refetch()} />
        ) : (
          <TrainingCharts
            series={series}
            running={running}
            candidates={perCandidate}
            current={running ? job.progress?.candidate : (job.winner ?? job.progress?.candidate)}
          />
        )}
      </section>

      <section aria-labelledby="checkpoints-title" className="card">
        <h2 id="checkpoints-title">Checkpoints</h2>
        <QueryState
          query={checkpoints}
          what="Loading checkpoints"
          isEmpty={(page) => page.data.length === 0}
          empty={running ? "No checkpoints yet: one is saved after each epoch." : "This job saved no checkpoints."}
        >
          {(page) => <CheckpointsTable checkpoints={page.data} suggested={job.publish} job={job} />}
        </QueryState>
      </section>

      <div className="grid2 live">
        <Timeline events={events} connection={connection} error={error} />
        <Logs jobId={job.id} running={running} />
      </div>

      <Plan jobId={job.id} />
    </div>
  );
}

export default function JobDetail() {
  const { jobId = "" } = useParams();
  const job = useQuery({
    queryKey: keys.job(jobId),
    queryFn: () => must(api.GET("/api/jobs/{job_id}", { params: { path: { job_id: jobId } } })) as Promise<Job>,
    // Read again while it runs by JobPage, as its events and progress make necessary.
  });

  if (job.error instanceof ApiError && job.error.status === 404) {
    return (
      <div className="state empty" role="alert">
        <h1>No such job</h1>
        <p>
          There is no job <code>{jobId}</code> in this project. <Link to="/jobs">Back to the jobs</Link>
        </p>
      </div>
    );
  }
  return (
    <QueryState query={job} what="Loading the job">
      {(data) => <JobPage job={data} />}
    </QueryState>
  );
}
