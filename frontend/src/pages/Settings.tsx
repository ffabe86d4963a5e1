// Settings: the project's secrets, API keys and webhooks, which only an admin key manages
// (app/api/deps.py); a member key is told so instead of three refusals.
import { useAuth } from "../auth";
import ApiKeys from "./settings/ApiKeys";
import Secrets from "./settings/Secrets";
import Webhooks from "./settings/Webhooks";
import "./settings/settings.css";

export default function Settings() {
  const { identity } = useAuth();
  const role = identity?.key.role;
  return (
    <>
      <h1>Settings</h1>
      {role && role !== "admin" ? (
        <p className="state" role="status">
          This browser signs in with a <strong>{role}</strong> key: it trains, deploys and chats. Secrets, API keys
          and webhooks are managed with an admin key.
        </p>
      ) : (
        <>
          <Secrets />
          <ApiKeys />
          <Webhooks />
        </>
      )}
    </>
  );
}
