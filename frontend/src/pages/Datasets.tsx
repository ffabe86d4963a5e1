import { ConfirmAction } from "../components/confirm";
import { useEffect, useState, type FormEvent } from "react";
import { useLocation } from "react-router-dom";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { api, authedFetch, must, type Dataset } from "../api/client";
import { ApiError, messageOf } from "../api/errors";
import { Field, described } from "../components/form";
import { Pager, useCursor } from "../components/pager";
import { QueryState } from "../components/states";
import { RelTime } from "../components/time";
import { DatasetPreview } from "./datasets/Preview";
import "./datasets/datasets.css";

export function bytes(n: number | null | undefined): string {
  if (n == null) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

const NAME_MAX = 255; // app/schemas/datasets.py NAME_MAX

/** Upload a JSONL chat file; the API's line-numbered problems are listed under the field. */
export function UploadDataset({ onUploaded }: { onUploaded?: (dataset: Dataset) => void }) {
  const [file, setFile] = useState<File | null>(null);
  const [name, setName] = useState("");
  const [problems, setProblems] = useState<{ line?: number | null; message: string }[]>([]);
  const [error, setError] = useState<string | null>(null);
  const queryClient = useQueryClient();
  const upload = useMutation({
    mutationFn: async () => {
      const form = new FormData();
      form.append("file", file!);
      if (name.trim()) form.append("name", name.trim());
      const response = await authedFetch("/api/datasets", { method: "POST", body: form });
      return (await response.json()) as Dataset;
    },
    onSuccess: (dataset) => {
      setFile(null);
      setName("");
      queryClient.invalidateQueries({ queryKey: ["datasets"] });
      onUploaded?.(dataset);
    },
    onError: (e) => {
      const found = e instanceof ApiError ? (e.body.errors ?? []) : [];
      setProblems(found);
      // The API's message points API clients at error.errors; here they are listed below it.
      const stopped = found.length > 1 && messageOf(e).includes("stopped reading");
      setError(
        found.length > 1
          ? `The file has ${stopped ? "at least " : ""}${found.length} problems, listed below.`
          : messageOf(e),
      );
    },
  });

  function submit(event: FormEvent) {
    event.preventDefault();
    setProblems([]);
    setError(null);
    if (!file) return setError("Choose a .jsonl file");
    if (name.length > NAME_MAX) return setError(`A name has at most ${NAME_MAX} characters`);
    upload.mutate();
  }

  return (
    <form onSubmit={submit} className="card" aria-label="Upload a dataset" noValidate>
      <h2>Upload JSONL</h2>
      <p className="hint">
        One conversation per line: <code>{'{"messages": [...]}'}</code> (OpenAI) or{" "}
        <code>{'{"conversations": [...]}'}</code> (ShareGPT).
      </p>
      <Field id="dataset-file" label="JSONL file" error={error ?? undefined}>
        <input
          {...described("dataset-file", error ?? undefined)}
          type="file"
          accept=".jsonl,.json,application/jsonl,application/x-ndjson"
          onChange={(e) => setFile(e.target.files?.[0] ?? null)}
        />
      </Field>
      {problems.length > 0 && (
        <ol className="problems" aria-label="Problems in the file">
          {problems.map((p, i) => (
            <li key={i}>
              {p.line != null && <strong>Line {p.line}:</strong>} {p.message}
            </li>
          ))}
        </ol>
      )}
      <Field id="dataset-name" label="Name (optional)">
        <input id="dataset-name" value={name} maxLength={NAME_MAX} onChange={(e) => setName(e.target.value)} />
      </Field>
      <button type="submit" className="primary" disabled={upload.isPending}>
        {upload.isPending ? "Uploading…" : "Upload"}
      </button>
    </form>
  );
}

function DatasetRow({ dataset, target }: { dataset: Dataset; target: boolean }) {
  const queryClient = useQueryClient();
  const [previewing, setPreviewing] = useState(false);
  // A public preset's rows are downloaded by the worker when a job trains on it.
  const previewable = dataset.kind !== "public" && (dataset.num_conversations ?? 0) > 0;
  const remove = useMutation({
    mutationFn: () => must(api.DELETE("/api/datasets/{dataset_id}", { params: { path: { dataset_id: dataset.id } } })),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["datasets"] }),
  });
  return (
    <>
      <tr id={dataset.id} className={target ? "target" : undefined}>
        <td>
          <strong>{dataset.name}</strong>
          <div className="mono dim">{dataset.id}</div>
        </td>
        <td>
          {dataset.kind === "public"
            ? `public: ${dataset.public_name}`
            : dataset.kind === "capture"
              ? "captured traffic"
              : dataset.format}
        </td>
        <td className="num">{dataset.num_conversations ?? "—"}</td>
        <td className="num">{bytes(dataset.num_bytes)}</td>
        <td>
          <RelTime at={dataset.created_at} />
        </td>
        <td className="actions">
          {previewable && (
            <button
              type="button"
              aria-expanded={previewing}
              aria-label={`${previewing ? "Hide" : "Preview"} the rows of ${dataset.name}`}
              onClick={() => setPreviewing(!previewing)}
            >
              {previewing ? "Hide" : "Preview"}
            </button>
          )}
          <ConfirmAction
            label="Delete"
            name={`Delete dataset ${dataset.name}`}
            question={`Delete dataset "${dataset.name}"?`}
            action={remove}
          />
        </td>
      </tr>
      {previewing && (
        <tr className="preview-row">
          <td colSpan={6}>
            <DatasetPreview dataset={dataset} />
          </td>
        </tr>
      )}
    </>
  );
}

export default function Datasets() {
  const cursor = useCursor();
  const datasets = useQuery({
    queryKey: ["datasets", cursor.after],
    queryFn: () => must(api.GET("/api/datasets", { params: { query: { limit: 20, after: cursor.after } } })),
  });
  // /datasets#ds_… (a deployment's capture links here): that row, shown and marked.
  const target = useLocation().hash.slice(1);
  const loaded = datasets.data !== undefined;
  useEffect(() => {
    if (target && loaded) document.getElementById(target)?.scrollIntoView({ block: "center" });
  }, [target, loaded]);
  return (
    <>
      <h1>Datasets</h1>
      <div className="split">
        <section aria-label="Datasets list">
          <QueryState
            query={datasets}
            what="Loading datasets"
            isEmpty={(d) => d.data.length === 0}
            empty={<p>No datasets yet. Upload a JSONL file of chats to train on.</p>}
          >
            {(page) => (
              <>
                <div className="table-wrap">
                  <table>
                    <thead>
                      <tr>
                        <th>Name</th>
                        <th>Format</th>
                        <th className="num">Chats</th>
                        <th className="num">Size</th>
                        <th>Created</th>
                        <th>
                          <span className="sr-only">Actions</span>
                        </th>
                      </tr>
                    </thead>
                    <tbody>
                      {page.data.map((d) => (
                        <DatasetRow key={d.id} dataset={d} target={d.id === target} />
                      ))}
                    </tbody>
                  </table>
                </div>
                <Pager cursor={cursor} hasMore={page.has_more} lastId={page.last_id} />
              </>
            )}
          </QueryState>
        </section>
        <UploadDataset />
      </div>
    </>
  );
}
