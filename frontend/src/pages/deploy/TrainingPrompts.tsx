// Prompts like the ones a deployment's drafter was trained on (the first user turn of the
// first rows of its job's dataset): a drafter is accepted most on its own traffic, so these
// show what it was made for. The demo drafter knows little beyond them.
import { useQuery } from "@tanstack/react-query";
import { Link } from "react-router-dom";
import { api, must, type Deployment } from "../../api/client";
import { keys } from "../job/model";

const SHOWN = 4;
const DATASET_ID = /^ds_[0-9a-f]{24}$/;

export function TrainingPrompts({ deployment, onPick }: { deployment: Deployment | undefined; onPick: (prompt: string) => void }) {
  const source = deployment?.source as { kind?: string; job_id?: string } | undefined;
  const jobId = source?.kind === "checkpoint" ? source.job_id : undefined;
  const job = useQuery({
    queryKey: keys.job(jobId ?? ""),
    queryFn: () => must(api.GET("/api/jobs/{job_id}", { params: { path: { job_id: jobId! } } })),
    enabled: jobId !== undefined,
    staleTime: 60_000,
  });
  const datasetId = job.data && DATASET_ID.test(job.data.dataset) ? job.data.dataset : undefined;
  const rows = useQuery({
    queryKey: ["dataset-rows", datasetId, 0, SHOWN],
    queryFn: () =>
      must(api.GET("/api/datasets/{dataset_id}/rows", { params: { path: { dataset_id: datasetId! }, query: { limit: SHOWN } } })),
    enabled: datasetId !== undefined,
    retry: false, // a public preset has no rows here (409): nothing to show
    staleTime: 60_000,
  });
  const prompts = (rows.data?.data ?? [])
    .map((row) => row.turns.find((t) => t.role === "user")?.text.trim())
    .filter((text): text is string => Boolean(text));
  if (!job.data || prompts.length === 0) return null;
  return (
    <div className="play-prompts" aria-label="Prompts from its training data" role="group">
      <p className="hint">
        From the data it was trained on (<Link to={`/jobs/${job.data.id}`}>{job.data.name ?? job.data.id}</Link>): a drafter is
        accepted most on prompts like these.
      </p>
      <ul>
        {prompts.map((prompt, i) => (
          <li key={i}>
            <button type="button" className="link" title={prompt} onClick={() => onPick(prompt)}>
              {prompt.length > 90 ? `${prompt.slice(0, 90)}…` : prompt}
            </button>
          </li>
        ))}
      </ul>
    </div>
  );
}
