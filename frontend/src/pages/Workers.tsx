// The registered workers: liveness, slots, their GPUs and what holds each one (refreshed every 5 s).
import { useQuery } from "@tanstack/react-query";
import { Link } from "react-router-dom";
import { api, must, type Schemas, type Worker } from "../api/client";
import { CopyBlock } from "../components/copy";
import { QueryState } from "../components/states";
import { StatusBadge } from "../components/status";
import { RelTime } from "../components/time";
import "./settings/settings.css";

type Running = Schemas["RunningOut"];

interface Gpu {
  index: number;
  name?: string;
  memory_total_mib?: number | null;
}

function gib(mib: number | null | undefined): string {
  return mib ? `${Math.round(mib / 1024)} GiB` : "";
}

/** Who holds a GPU or slot: a link to the job or deployment, or "busy" for another project's. */
function Holder({ item }: { item: Running }) {
  if (item.id === null)
    return (
      <span className="holder" title={`Another project's ${item.kind}`}>
        <span className="badge muted">busy</span>
        <span className="dim">another project's {item.kind}</span>
      </span>
    );
  const to = item.kind === "job" ? `/jobs/${item.id}` : `/deployments/${item.id}`;
  return (
    <span className="holder">
      <span className="dim">{item.kind}</span>
      <Link to={to} className="mono">
        {item.name ?? item.id}
      </Link>
      {item.replica ? <span className="dim">replica {item.replica}</span> : null}
      <StatusBadge status={item.status} />
    </span>
  );
}

function Unit({ label, detail, holders }: { label: string; detail?: string; holders: Running[] }) {
  return (
    <li>
      <span className="unit">{label}</span>
      {detail && <span className="dim hide-narrow">{detail}</span>}
      {holders.length === 0 ? <span className="free">free</span> : holders.map((h, i) => <Holder key={i} item={h} />)}
    </li>
  );
}

/** One line per GPU and per training and serving slot (local runtime); on a worker with GPUs,
 * only the slots something holds. */
function Units({ worker }: { worker: Worker }) {
  const gpus = worker.gpus as unknown as Gpu[];
  const running = worker.running;
  const slots = (count: number, kind: Running["kind"], label: string) =>
    Array.from({ length: count }, (_, i) => ({
      key: `${kind}-${i}`,
      label: `${label} ${i}`,
      holders: running.filter((r) => r.kind === kind && r.slots.includes(i)),
    }))
      .filter((slot) => gpus.length === 0 || slot.holders.length > 0)
      .map((slot) => <Unit key={slot.key} label={slot.label} holders={slot.holders} />);
  return (
    <ul className="units" aria-label={`GPUs of ${worker.id}`}>
      {gpus.length === 0 && <li className="dim">No GPUs: runs the local (CPU) runtime.</li>}
      {gpus.map((gpu) => (
        <Unit
          key={gpu.index}
          label={`GPU ${gpu.index}`}
          detail={[gpu.name, gib(gpu.memory_total_mib)].filter(Boolean).join(" · ")}
          holders={running.filter((r) => r.gpus.includes(gpu.index))}
        />
      ))}
      {slots(worker.capacity, "job", "Training slot")}
      {slots(worker.serving_slots, "deployment", "Serving slot")}
    </ul>
  );
}

function NoWorkers() {
  return (
    <div className="workers-empty">
      <p>
        <strong>No workers have registered.</strong> Jobs and deployments wait until one is online. Start one on each
        machine that should train or serve (with the same <code>SPECDECK_DATABASE_URL</code> and{" "}
        <code>SPECDECK_BROKER_URL</code> as the API):
      </p>
      <CopyBlock label="Start a worker" text="specdeck worker" />
      <p className="hint">
        It offers the GPUs it finds (pin them with <code>SPECDECK_WORKER_GPUS=0,1</code>); without GPUs it runs the
        local CPU runtime. <code>specdeck run</code> starts one next to the API for development.
      </p>
    </div>
  );
}

export default function Workers() {
  const workers = useQuery({
    queryKey: ["workers"],
    queryFn: () => must(api.GET("/api/workers")),
    refetchInterval: 5000,
  });
  return (
    <>
      <h1>Workers</h1>
      <QueryState
        query={workers}
        what="Loading workers"
        isEmpty={(page) => page.data.length === 0}
        empty={<NoWorkers />}
      >
        {(page) => (
          <div className="table-wrap">
            <table aria-label="Workers">
              <thead>
                <tr>
                  <th>Worker</th>
                  <th>Alive</th>
                  <th className="hide-narrow">Started</th>
                  <th className="num hide-narrow">Training slots</th>
                  <th className="num hide-narrow">Serving slots</th>
                  <th>GPUs and what runs</th>
                </tr>
              </thead>
              <tbody>
                {page.data.map((w) => (
                  <tr key={w.id}>
                    <td>
                      <strong>{w.host}</strong>
                      <div className="mono dim">{w.id}</div>
                      <div className="mono dim hide-narrow" title="Celery queue">
                        {w.queue}
                      </div>
                    </td>
                    <td>
                      <span className={`badge ${w.alive ? "good" : "bad"}`}>{w.alive ? "alive" : "offline"}</span>
                      <div className="dim nowrap" title="Last heartbeat">
                        <span className="sr-only">Last heartbeat </span>
                        <RelTime at={w.last_heartbeat_at} />
                      </div>
                    </td>
                    <td className="hide-narrow">
                      <RelTime at={w.started_at} />
                    </td>
                    <td className="num hide-narrow">{w.capacity}</td>
                    <td className="num hide-narrow">{w.serving_slots}</td>
                    <td>
                      <Units worker={w} />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </QueryState>
    </>
  );
}
