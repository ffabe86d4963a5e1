// Who is signed in: the key (in session.ts) and the identity the API gives for it (GET /api/me:
// the project and the key's name and prefix; fetched with the key given, before it is stored). Any 401 clears the key and shows sign-in again.
import { createContext, useContext, useEffect, useSyncExternalStore, type ReactNode } from "react";
import { useQuery, useQueryClient } from "@tanstack/react-query";
import { ApiError } from "./api/errors";
import type { components } from "./api/schema";
import { session } from "./api/session";

export type Identity = components["schemas"]["IdentityOut"];

/** Ask the API who this key is; throws an ApiError (401 for a bad key). */
export async function whoIs(key: string): Promise<Identity> {
  const response = await fetch("/api/me", { headers: { Authorization: `Bearer ${key}` } });
  const body = await response.json().catch(() => undefined);
  if (!response.ok) throw ApiError.from(response.status, body);
  return body as Identity;
}

interface Auth {
  key: string | null;
  identity: Identity | undefined;
  signOut: () => void;
}

const AuthContext = createContext<Auth>({ key: null, identity: undefined, signOut: () => {} });

export function AuthProvider({ children }: { children: ReactNode }) {
  const key = useSyncExternalStore(session.subscribe, () => session.key());
  const queryClient = useQueryClient();
  const identity = useQuery({
    queryKey: ["me", key],
    queryFn: () => whoIs(key!),
    enabled: key !== null,
    staleTime: 60_000,
  });
  useEffect(() => {
    if (identity.error instanceof ApiError && identity.error.status === 401) session.expired();
  }, [identity.error]);
  useEffect(() => {
    if (key === null) queryClient.clear(); // nothing of the last project stays in memory
  }, [key, queryClient]);
  const signOut = () => {
    session.clear();
    queryClient.clear();
    window.location.assign("/sign-in");
  };
  return <AuthContext.Provider value={{ key, identity: identity.data, signOut }}>{children}</AuthContext.Provider>;
}

export const useAuth = () => useContext(AuthContext);
