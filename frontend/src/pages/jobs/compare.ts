// Which jobs the compare page shows (/jobs/compare?ids=job_a,job_b).
export const MAX_COMPARED = 6;
const JOB_ID = /^job_[0-9a-f]+$/;

/** The job ids of `?ids=`, valid and unique, at most MAX_COMPARED. */
export function comparedIds(param: string | null): string[] {
  const ids = (param ?? "").split(",").map((s) => s.trim()).filter((s) => JOB_ID.test(s));
  return [...new Set(ids)].slice(0, MAX_COMPARED);
}
