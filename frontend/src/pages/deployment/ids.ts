// Ids for narrow places: "ckpt_01a2…" as its prefix and last six hex digits ("ckpt_…3f9a1c").
const ID = /^([a-z]+_)[0-9a-f]{24}$/;

/** An id of the API shortened; anything else (a drafter's path or Hub id) as it is. */
export function shortId(id: string): string {
  const match = ID.exec(id);
  return match ? `${match[1]}…${id.slice(-6)}` : id;
}
