// What the stack offers, for the forms: its workers (GPUs, free serving slots) and the models
// under the models root a job can name.
import { useQuery } from "@tanstack/react-query";
import { api, must, type Schemas } from "./client";

type Worker = Schemas["WorkerOut"];

export function useWorkers() {
  return useQuery({ queryKey: ["workers"], queryFn: () => must(api.GET("/api/workers")), staleTime: 10_000 });
}

export function useLocalVerifiers() {
  return useQuery({ queryKey: ["verifiers"], queryFn: () => must(api.GET("/api/verifiers")), staleTime: 60_000 });
}

/** Whether a live worker offers GPUs (the vllm runtime's fields mean something). */
export function offersGpus(workers: Worker[]): boolean {
  return workers.some((w) => w.alive && w.gpus.length > 0);
}

/** Whether a live worker could start one more engine of `runtime` now: a free serving slot
 * (local), `gpus` GPUs nothing holds (vllm). */
export function hasFreeServingSlot(workers: Worker[], runtime: "local" | "vllm", gpus = 1): boolean {
  return workers.some((w) => {
    if (!w.alive) return false;
    if (runtime === "local") {
      const held = w.running.filter((r) => r.kind === "deployment" && r.slots.length > 0).length;
      return w.serving_slots > held;
    }
    const busy = new Set(w.running.flatMap((r) => r.gpus));
    return w.gpus.length - busy.size >= gpus;
  });
}
